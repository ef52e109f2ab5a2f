-- A message that its lock's line handed a place reaches the broker: its place, while it is
-- still queued, records the message as the broker has it (its broker id).
-- KEYS[1]: the lock. ARGV: owner, holder.
-- Returns {1, token, expires_at or 0}, or {0} when the owner holds no queued place: a copy of
-- the message started already, or the place was freed.
local key, owner = KEYS[1], ARGV[1]
local holders, count = live_holders(key)
local record = holders[owner]
local reply = {0}
if record and queued(record) then
  local expires_at, token, acquired_at = parse(record)
  record = format_record(expires_at, token, acquired_at, share_names(key, count - 1, ARGV[2]))
  write_holder(key, owner, record)
  holders[owner] = record
  reply = {1, token, expires_at or 0}
end
expire_with_holders(key, holders, count)
return reply
