-- Gives up `owner`'s place only while it is still exactly `record`: the orphan
-- reaper never frees a place that was renewed or re-taken after it read it.
-- KEYS[1]: the lock. ARGV: owner, record. Returns 1, or 0 when the place changed or went.
local holders, count = live_holders(KEYS[1])
local removed = 0
if holders[ARGV[1]] == ARGV[2] then
  write_holder(KEYS[1], ARGV[1], false)
  holders[ARGV[1]] = nil
  count, removed = count - 1, 1
end
expire_with_holders(KEYS[1], holders, count)
return removed
