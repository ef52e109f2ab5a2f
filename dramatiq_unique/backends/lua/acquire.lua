-- KEYS[1]: the lock.
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder.
return acquire(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5])
