-- flags: allow-oom
-- Removes workers from the registry, with what they published of the messages in their hands.
-- KEYS[1]: the worker registry; KEYS[2]: the hash of publications.
-- ARGV: "worker", worker_id | "before", a time in ms (every worker alive only until before it).
-- Returns how many left the registry.
local gone
if ARGV[1] == "worker" then
  gone = {ARGV[2]}
else
  gone = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", "(" .. ARGV[2])
  -- Publications of workers that left the registry some other way (an earlier version).
  for _, worker in ipairs(redis.call("HKEYS", KEYS[2])) do
    if not redis.call("ZSCORE", KEYS[1], worker) then table.insert(gone, worker) end
  end
end
local removed = 0
for _, worker in ipairs(gone) do
  removed = removed + redis.call("ZREM", KEYS[1], worker)
  redis.call("HDEL", KEYS[2], worker)
end
return removed
