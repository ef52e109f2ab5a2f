-- flags: no-writes
-- Reads the worker registry with the server's clock, in one step.
-- KEYS[1]: the worker registry. Returns {now, worker_id, alive until, ...}.
local now = clock()
local reply = {now}
local entries = redis.call("ZRANGE", KEYS[1], 0, -1, "WITHSCORES")
for i = 1, #entries do table.insert(reply, entries[i]) end
return reply
