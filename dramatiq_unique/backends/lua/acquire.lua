-- KEYS[1]: the lock; KEYS[2]: the format key of its hash slot, and KEYS[3], KEYS[4]: the
-- refusal and the mark (new_places_refused), or none; or none of the three (read_for_place).
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder.
local value, refused = read_for_place(KEYS, 2)
return acquire(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], refused, value)
