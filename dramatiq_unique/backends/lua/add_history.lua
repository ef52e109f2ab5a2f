-- Adds entries to the conflict trail of one lock prefix, a stream, in one call, and bounds it: at
-- most a number of entries, none older than the retention; the whole key goes once nothing was
-- added for the retention.
-- KEYS[1]: the trail.
-- ARGV: the most entries kept, the retention in ms; then, for each entry, its number of fields n
-- followed by n pairs of field and value.
-- Returns how many entries the trail holds.
local key = KEYS[1]
local most, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local i = 3
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local entry = {}
  for j = 1, 2 * n do
    entry[j] = ARGV[i + j]
  end
  redis.call("XADD", key, "MAXLEN", most, "*", unpack(entry))
  i = i + 1 + 2 * n
end
-- An entry's id is the server's time when it was added.
local oldest = clock() - retention
local minid = string.format("%.0f", oldest)
local trimmed = redis.pcall("XTRIM", key, "MINID", minid)
if type(trimmed) == "table" and trimmed.err then
  -- Redis 6.0 and 6.1 have no MINID: the old entries are deleted one by one, a bounded number a call.
  local old = redis.call("XRANGE", key, "-", string.format("%.0f", oldest - 1), "COUNT", 1000)
  for _, entry in ipairs(old) do
    redis.call("XDEL", key, entry[1])
  end
end
redis.call("PEXPIRE", key, retention)
return redis.call("XLEN", key)
