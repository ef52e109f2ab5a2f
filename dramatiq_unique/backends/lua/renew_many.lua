-- Renews many leases (renew_place), with one clock. KEYS: the lock of each (a lock may come more
-- than once). ARGV: owner, ttl in ms and deadline in ms (0: none) of each, three a lease.
-- Returns renew's answer for each, in order.
local renewed = {}
for i = 1, #KEYS do
  local at = 3 * i - 2
  table.insert(renewed, renew_place(KEYS[i], ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])))
end
return renewed
