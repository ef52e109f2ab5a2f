-- Asks running holders to stop: marks each one's holder with "!" after its lock type, and who
-- asked in a last field, which its worker reads in the answer to its next lease renewal
-- (renew_many). A holder asked before keeps the first who asked. KEYS[1]: the lock. ARGV[1]:
-- who asks; the others: the message_ids of the holders to ask, none for every running holder.
-- Answers the message_ids of the holders marked (now or before), oldest first.
local key = KEYS[1]
live_holders(key, true)
local lock = locks[key]
-- As Holder.encode writes it: escaped, with "*" too (no "*" but a handed place's).
local by = string.gsub(escape(ARGV[1]), "%*", "%%2A")
local wanted = {}
for i = 2, #ARGV do wanted[ARGV[i]] = true end
local marked = {}
for _, owner in ipairs(lock.owners) do
  local record = lock.records[owner]
  local expires_at, token, acquired_at, holder = parse(record)
  local id = message_id(owner, holder)
  if string.sub(holder, 1, 1) == "r" and (#ARGV == 1 or wanted[id]) then
    if string.match(holder, "^r%l!") == nil then
      -- An empty call field in front of it for a holder that keeps no call.
      local _, bars = string.gsub(holder, "|", "|")
      if bars == 5 then holder = holder .. "|" end
      holder = string.sub(holder, 1, 2) .. "!" .. string.sub(holder, 3) .. "|" .. by
      write_holder(key, owner, format_record(expires_at, token, acquired_at, holder))
    end
    table.insert(marked, id)
  end
end
expire_with_holders(key)
return marked
