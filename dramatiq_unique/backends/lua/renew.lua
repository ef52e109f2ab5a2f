-- Renews a lease (renew_place). KEYS[1]: the lock. ARGV: owner, ttl in ms, deadline in ms (0: none).
-- Returns the new expiry, 0 for a place that never lapses, -1 when owner holds no place.
return renew_place(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
