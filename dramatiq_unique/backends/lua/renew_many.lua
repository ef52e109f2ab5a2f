-- Renews many leases (renew_place), with one clock. KEYS: the lock of each (a lock may come more
-- than once). ARGV: owner, ttl in ms and deadline in ms (0: none) of each, three a lease.
-- Returns renew's answer for each, in order; for a holder asked to stop (request_stop.lua) it is
-- the text "!" followed by the new expiry.
local renewed = {}
for i = 1, #KEYS do
  local at = 3 * i - 2
  local expires_at, stop = renew_place(KEYS[i], ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]))
  if stop then expires_at = "!" .. string.format("%d", expires_at) end
  table.insert(renewed, expires_at)
end
return renewed
