-- KEYS[1]: the lock; KEYS[2], KEYS[3]: the fence and the format of its hash slot, and KEYS[4],
-- KEYS[5]: the refusal and the mark (new_places_refused), or none (read_for_place).
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder.
local value, refused = read_for_place(KEYS, 2)
return acquire(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], refused, value)
