-- Renews a lease: pushes `owner`'s expiry back to `ttl` ms from now,
-- never past `deadline` and never earlier than it was. Owner-checked.
-- KEYS[1]: the lock. ARGV: owner, ttl in ms, deadline in ms (0: none).
-- Returns the new expiry, 0 for a place that never lapses, -1 when owner holds no place.
local now = clock()
local holders, count = live_holders(KEYS[1])
local record = holders[ARGV[1]]
if not record then
  expire_with_holders(KEYS[1], holders, count)
  return -1
end
local expires_at, token, acquired_at, holder = parse(record)
if expires_at then
  local target = now + tonumber(ARGV[2])
  local deadline = tonumber(ARGV[3])
  if deadline > 0 and target > deadline then target = deadline end
  if target > expires_at then
    expires_at = target
    record = format_record(expires_at, token, acquired_at, holder)
    write_holder(KEYS[1], ARGV[1], record)
    holders[ARGV[1]] = record
  end
end
expire_with_holders(KEYS[1], holders, count)
return expires_at or 0
