-- flags: no-writes
-- Reads the worker registry and what each worker last published of the messages in its hands,
-- with the server's clock, in one step.
-- KEYS[1]: the worker registry; KEYS[2]: the hash of publications.
-- Returns {now, {worker_id, alive until, ...}, {worker_id, publication, ...}}.
return {clock(), redis.call("ZRANGE", KEYS[1], 0, -1, "WITHSCORES"), redis.call("HGETALL", KEYS[2])}
