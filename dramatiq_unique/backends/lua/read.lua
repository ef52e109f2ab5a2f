-- Reads the places of the locks of one digest, for the operations API; changes nothing.
-- KEYS: the locks (one digest, one hash slot).
-- Returns {now, key index, owner, record, key index, owner, record, ...}, without lapsed
-- places, and with each lock's names field (the actor and queue its places leave out).
local now = clock()
local reply = {now}
for i, key in ipairs(KEYS) do
  local fields = redis.call("HGETALL", key)
  for j = 1, #fields, 2 do
    local owner, record = fields[j], fields[j + 1]
    if owner ~= FENCE then
      local expires_at = nil
      if owner ~= NAMES then expires_at = parse(record) end
      if not expires_at or expires_at > now then
        table.insert(reply, i)
        table.insert(reply, owner)
        table.insert(reply, record)
      end
    end
  end
end
return reply
