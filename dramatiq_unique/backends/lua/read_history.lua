-- flags: no-writes
-- Reads the conflict trail of one lock prefix, newest first; changes nothing.
-- KEYS[1]: the trail.
-- ARGV: since (ms of the server's clock, or ""), actor (or ""), digest (or ""), the most entries
-- returned, the margin in ms by which an entry may have been added after it happened, and
-- within (ms before now, or ""): the later of since and now - within counts.
-- Returns {now, id, fields, id, fields, ...}: the entries whose "at" is at least since and whose
-- "actor" and "digest" are those asked for, each with its fields as stored.
local key = KEYS[1]
local since, actor, digest = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local limit, margin = tonumber(ARGV[4]), tonumber(ARGV[5])
local CHUNK = 256
local now = clock()
local within = tonumber(ARGV[6])
if within and (not since or now - within > since) then
  since = now - within
end
local reply = {now}
local found = 0
local lowest = since and string.format("%.0f", since - margin) or "-"
local last, skip = "+", nil
while found < limit do
  local asked = skip and CHUNK + 1 or CHUNK
  local entries = redis.call("XREVRANGE", key, last, lowest, "COUNT", asked)
  for _, entry in ipairs(entries) do
    local id, fields = entry[1], entry[2]
    if id ~= skip and found < limit then
      local seen = {}
      for f = 1, #fields, 2 do
        seen[fields[f]] = fields[f + 1]
      end
      if (actor == "" or seen["actor"] == actor) and (digest == "" or seen["digest"] == digest)
        and (not since or (tonumber(seen["at"]) or 0) >= since) then
        found = found + 1
        table.insert(reply, id)
        table.insert(reply, fields)
      end
    end
  end
  if #entries < asked then
    break
  end
  last, skip = entries[#entries][1], entries[#entries][1]
end
return reply
