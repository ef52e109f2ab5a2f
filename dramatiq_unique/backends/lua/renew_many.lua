-- Renews many leases (renew_place), with one clock. KEYS: the lock of each (a lock may come more
-- than once). ARGV: owner, ttl in ms and deadline in ms (0: none) of each, three a lease.
-- Returns renew's answer for each, in order; for a holder asked to stop (request_stop.lua) it is
-- the text "!", the new expiry, "|" and who asked, as the record escapes it.
local renewed = {}
for i = 1, #KEYS do
  local at = 3 * i - 2
  local expires_at, by = renew_place(KEYS[i], ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]))
  if by then expires_at = "!" .. string.format("%d", expires_at) .. "|" .. by end
  table.insert(renewed, expires_at)
end
return renewed
