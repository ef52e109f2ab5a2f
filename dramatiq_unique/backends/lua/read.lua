-- flags: no-writes
-- Reads the places of the locks of one digest, for the operations API; changes nothing.
-- KEYS: the locks (one digest, one hash slot).
-- Returns {now, key index, field, value, key index, field, value, ...}: each lock's fields
-- as stored, without lapsed places and without the fence, but with the names field (the
-- actor and queue its places leave out) and every place this version cannot read. RedisBackend
-- reads them as it reads a whole hash.
local now = clock()
local reply = {now}
for i, key in ipairs(KEYS) do
  local fields = redis.call("HGETALL", key)
  for j = 1, #fields, 2 do
    local field, value = fields[j], fields[j + 1]
    if field ~= FENCE then
      local expires_at = nil
      if field_owner(field) then
        local lapses, token, _, holder = parse(value)
        -- A place this version cannot read is shown as it is: its reader says so.
        if token and readable_holder(holder) then expires_at = lapses end
      end
      if not expires_at or expires_at > now then
        table.insert(reply, i)
        table.insert(reply, field)
        table.insert(reply, value)
      end
    end
  end
end
return reply
