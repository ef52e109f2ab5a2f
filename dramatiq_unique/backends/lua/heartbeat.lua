-- Records that a worker is alive now (SPEC R1), by the server's clock.
-- KEYS[1]: the worker registry (a ZSET worker_id -> last heartbeat in ms). ARGV: worker_id.
local now = clock()
redis.call("ZADD", KEYS[1], now, ARGV[1])
return now
