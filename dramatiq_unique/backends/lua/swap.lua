-- flags: allow-oom
-- Takes a place in the run lock and, only if that worked, gives up the
-- enqueue lock's place, in one step (until_and_while_executing).
-- KEYS[1]: the enqueue lock, KEYS[2]: the run lock, KEYS[3]: the replaced set; KEYS[4], KEYS[5]:
-- the lists of their lines, KEYS[6], KEYS[7]: the digest's waiters and served copies (line_at);
-- one digest, one hash slot. KEYS[8] on: the keys of its hash slot (read_for_place).
-- ARGV: enqueue owner, run owner, limit, ttl in ms (0: never lapses), holder, the copy of the
-- message (served_before), and when the message waits in the run lock's line if every place is taken:
-- "start", its waiter entry, the line limit, "1" when the newest keeps the last place of a full line.
-- Returns {acquire's or take_or_wait's reply, or {-1} when a newer message took the enqueue
-- owner's place (then any place it took again since, a delayed copy or a retry coming due, is
-- given up), or {-3} when this copy of a message handed a place by a line started before; the
-- messages the lines were handed; the waiters dropped (hand_over)}. A message that runs, or waits in the run lock's line, left
-- its queue: it gives up its enqueue place.
local enqueue_line = line_at(KEYS[4], KEYS[6], KEYS[7])
-- Read first: an enqueue lock this version cannot read fails the script before it writes.
local enqueue_value = redis.call("GET", KEYS[1])
if redis.call("SREM", KEYS[3], ARGV[1]) == 1 then
  local _, handed = release_place(KEYS[1], enqueue_line, ARGV[1], false)
  return {{-1}, handed, dropped}
end
if ARGV[6] ~= "" then
  local place = live_holders(KEYS[1], false, enqueue_value)[ARGV[1]]
  if served_before(enqueue_line, ARGV[1], ARGV[6]) or handed_to_another(enqueue_line, ARGV[1], place, ARGV[6]) then
    return {{-3}, {}, {}}
  end
end
local value, refused = read_for_place({KEYS[2], unpack(KEYS, 8)}, 2)
local reply, handed
if ARGV[7] == "start" then
  reply, handed = take_or_wait(
    KEYS[2], line_at(KEYS[5], KEYS[6], KEYS[7]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), 0, ARGV[5],
    refused, "start", ARGV[6], ARGV[8], tonumber(ARGV[9]), ARGV[10] == "1", value)
else
  local holders, count = live_holders(KEYS[2], false, value)
  handed, count = hand_over_first(KEYS[2], holders, count, line_at(KEYS[5], KEYS[6], KEYS[7]))
  reply = take_place(KEYS[2], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), 0, ARGV[5], refused, holders, count)
  if handed == NOTHING then handed = {} end
end
expire_with_holders(KEYS[2])
if reply[1] == 1 then serve(enqueue_line, ARGV[1], ARGV[6]) end
if reply[1] == 1 or reply[1] == 3 then
  local _, more = release_place(KEYS[1], enqueue_line, ARGV[1], reply[1] == 3, enqueue_value)
  for _, message in ipairs(more) do table.insert(handed, message) end
end
return {reply, handed, dropped}
