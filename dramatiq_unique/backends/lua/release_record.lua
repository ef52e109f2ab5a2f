-- flags: allow-oom
-- Gives up `owner`'s place only while it is still exactly `record`: the orphan
-- reaper never frees a place that was renewed or re-taken after it read it.
-- KEYS[1]: the lock; KEYS[2], KEYS[3], KEYS[4]: its line (line_at); KEYS[5]: the format key of
-- its hash slot (open_slot). ARGV: owner, record, and
-- "1" for a caller that cannot enqueue the messages a line is handed (it has no broker).
-- Returns {1, or 0 when the place changed or went; the messages the line was handed; the waiters
-- dropped (hand_over)}, or, for such a caller when messages wait in the line, {0, {}, {}, how
-- many wait}: it frees nothing.
local key, line = KEYS[1], line_at(KEYS[2], KEYS[3], KEYS[4])
local waiting = without_broker_waiting(line, ARGV[3])
if waiting > 0 then return {0, {}, {}, waiting} end
open_slot(KEYS[5])
local holders, count = live_holders(key)
local removed = 0
local record = holders[ARGV[1]]
-- A place that lapsed as read is freed too: the read above dropped it.
local lapsed = locks[key].lapsed[ARGV[1]] == ARGV[2]
if record == ARGV[2] or lapsed then
  if not lapsed then
    write_holder(key, ARGV[1], false)
    holders[ARGV[1]] = nil
    count = count - 1
  end
  removed = 1
  local _, _, _, held = parse(ARGV[2])
  redis.call("HDEL", line.waiters, message_id(ARGV[1], held))
end
local handed
handed, count = hand_over(key, line, holders, count)
expire_with_holders(key)
return {removed, handed, dropped}
