-- A message that its lock's line handed a place reaches the broker: its place, while it is
-- still queued and handed to this copy, records the message as the broker has it (its broker id).
-- KEYS[1]: the lock. ARGV: owner, holder, the token of the place handed to this copy.
-- Returns {1, token, expires_at or 0}, or {0} when the owner holds no such place: a copy of
-- the message started already, the place was handed again to another copy, or it was freed.
local key, owner = KEYS[1], ARGV[1]
local holders = live_holders(key, true)
local record = holders[owner]
local reply = {0}
local expires_at, token, acquired_at = nil, nil, nil
if record then expires_at, token, acquired_at = parse(record) end
if record and queued(record) and token == tonumber(ARGV[3]) then
  record = format_record(expires_at, token, acquired_at, mark_handed(ARGV[2]))
  write_holder(key, owner, record)
  holders[owner] = record
  reply = {1, token, expires_at or 0}
end
expire_with_holders(key)
return reply
