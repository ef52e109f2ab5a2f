-- Gives up, at once, the place of each owner that is still exactly the record read: an
-- unlock frees the holders it showed, never one that renewed or took the lock since. A
-- re-entry that left its record as it was (no new expiry, no new broker id) cannot be told
-- apart. The fence stays, so tokens keep increasing.
-- KEYS[1]: the lock. ARGV: owner, record, owner, record, ... Returns the owners freed.
local holders, count = live_holders(KEYS[1])
local removed = {}
for i = 1, #ARGV, 2 do
  local owner = ARGV[i]
  if holders[owner] == ARGV[i + 1] then
    write_holder(KEYS[1], owner, false)
    holders[owner] = nil
    count = count - 1
    table.insert(removed, owner)
  end
end
expire_with_holders(KEYS[1], holders, count)
return removed
