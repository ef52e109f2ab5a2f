-- Records that a worker is alive for `ttl` ms from now, by the server's clock.
-- KEYS[1]: the worker registry (a ZSET worker_id -> the time in ms until which it counts as alive).
-- ARGV: worker_id, ttl in ms (the worker's lease period). Returns now.
local now = clock()
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return now
