-- The orphan reaper enqueues again a message that a line handed a place and that never reached
-- the broker: the place, while it is still exactly `record` and its message waits, gets a new
-- token, so that the copy first handed it, if it reaches a worker after all, does not take it.
-- KEYS[1]: the lock; KEYS[2], KEYS[3], KEYS[4]: its line (line_at); KEYS[5]: the format key of
-- its hash slot (open_slot). ARGV: owner, record.
-- Returns {"<token>\n<message>" as hand_over answers it, or false when the place changed or
-- went, its message started, its waiter entry could not be read (then it is dropped: the next
-- run of the reaper frees the place) or the lock holds a record this version cannot read; the
-- waiters dropped (hand_over)}.
local key, line, owner = KEYS[1], line_at(KEYS[2], KEYS[3], KEYS[4]), ARGV[1]
open_slot(KEYS[5])
local holders = live_holders(key, true)
local record = holders[owner]
local answer = false
if record == ARGV[2] and not unreadable[key] then
  local expires_at, _, _, holder = parse(record)
  local id = message_id(owner, holder)
  local entry = redis.call("HGET", line.waiters, id)
  local message = nil
  if entry then
    local limit, _, waiting = parse_waiter(entry)
    if limit then message = waiting else drop_waiter(key, line, id) end
  end
  if message then
    local token = new_token()
    record = format_record(expires_at, token, clock(), holder)
    write_holder(key, owner, record)
    holders[owner] = record
    answer = string.format("%d", token) .. "\n" .. message
  end
end
expire_with_holders(key)
return {answer, dropped}
