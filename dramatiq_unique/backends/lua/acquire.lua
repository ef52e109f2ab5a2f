-- KEYS[1]: the lock; KEYS[2], KEYS[3]: the refusal and the mark (new_places_refused), or none.
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder.
local refused = new_places_refused(KEYS[2], KEYS[3])
return acquire(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], refused)
