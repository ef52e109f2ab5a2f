-- Records that a worker is alive for `ttl` ms from now, by the server's clock.
-- KEYS[1]: the worker registry (a ZSET worker_id -> the time in ms until which it counts as alive).
-- KEYS[2], optional: what each worker last published of the messages in its hands (a hash
-- worker_id -> its publication).
-- ARGV: worker_id, ttl in ms (the worker's lease period), its publication (with KEYS[2]). Returns now.
local now = clock()
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if KEYS[2] then
  redis.call("HSET", KEYS[2], ARGV[1], ARGV[3])
end
return now
