-- flags: no-writes
-- Reads the places of the locks of one digest, for the operations API; changes nothing.
-- KEYS: the locks (one digest, one hash slot).
-- Returns {now, key index, owner, record, key index, owner, record, ...}: each lock's places as
-- stored, without lapsed places, and every line this version cannot read (its owner is then what
-- comes before its first "|", or the whole line). RedisBackend reads them as it reads a lock.
local now = clock()
local reply = {now}
for i, key in ipairs(KEYS) do
  local value = redis.call("GET", key)
  if value then
    for line in string.gmatch(value, "[^\n]+") do
      if line ~= WAITS then
        local owner, record, expires_at, readable = read_line(line)
        -- A place this version cannot read is shown as it is: its reader says so.
        if not readable or not expires_at or expires_at > now then
          table.insert(reply, i)
          table.insert(reply, owner)
          table.insert(reply, record)
        end
      end
    end
  end
end
return reply
