-- Asks running holders to stop: marks each one's holder with "!" after its lock type, which its
-- worker reads in the answer to its next lease renewal (renew_many). KEYS[1]: the lock. ARGV: the
-- message_ids of the holders to ask; none for every running holder. Answers the message_ids of
-- the holders marked (now or before), oldest first.
local key = KEYS[1]
live_holders(key, true)
local lock = locks[key]
local wanted = {}
for i = 1, #ARGV do wanted[ARGV[i]] = true end
local marked = {}
for _, owner in ipairs(lock.owners) do
  local record = lock.records[owner]
  local expires_at, token, acquired_at, holder = parse(record)
  local id = message_id(owner, holder)
  if string.sub(holder, 1, 1) == "r" and (#ARGV == 0 or wanted[id]) then
    if string.match(holder, "^r%l!") == nil then
      holder = string.sub(holder, 1, 2) .. "!" .. string.sub(holder, 3)
      write_holder(key, owner, format_record(expires_at, token, acquired_at, holder))
    end
    table.insert(marked, id)
  end
end
expire_with_holders(key)
return marked
