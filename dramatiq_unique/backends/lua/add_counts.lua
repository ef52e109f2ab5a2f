-- Adds to counters kept in hashes (the lock activity per minute), in one call.
-- KEYS: the hashes, of one hash tag.
-- ARGV: the ttl in ms of every key; then, for each key, its number of fields n
-- followed by n pairs of field and increment.
local ttl = tonumber(ARGV[1])
local i = 2
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    redis.call("HINCRBY", KEYS[k], ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  redis.call("PEXPIRE", KEYS[k], ttl)
end
return #KEYS
