-- flags: allow-oom
-- Gives up, at once, the place of each owner that is still exactly the record read: an
-- unlock frees the holders it showed, never one that renewed or took the lock since. A
-- re-entry that left its record as it was (no new expiry, no new broker id) cannot be told
-- apart. The slot's last token stays, so tokens keep increasing. A message freed leaves the waiters, and
-- the places freed go to the line.
-- KEYS[1]: the lock; KEYS[2], KEYS[3], KEYS[4]: its line (line_at); KEYS[5]: the format key of
-- its hash slot (open_slot).
-- ARGV: "1" for a caller that cannot enqueue the messages a line is handed (it has no broker),
-- else "", then owner, record, owner, record, ... Returns {the owners freed, the messages the
-- line was handed, the waiters dropped (hand_over)}, or, for such a caller when messages wait
-- in the line, {{}, {}, {}, how many wait}: it frees nothing.
local key, line = KEYS[1], line_at(KEYS[2], KEYS[3], KEYS[4])
local waiting = without_broker_waiting(line, ARGV[1])
if waiting > 0 then return {{}, {}, {}, waiting} end
open_slot(KEYS[5])
local holders, count = live_holders(key)
local removed = {}
for i = 2, #ARGV, 2 do
  local owner, record = ARGV[i], holders[ARGV[i]]
  -- A place that lapsed as read is freed too: the read above dropped it.
  local lapsed = locks[key].lapsed[owner] == ARGV[i + 1]
  if record == ARGV[i + 1] or lapsed then
    if not lapsed then
      write_holder(key, owner, false)
      holders[owner] = nil
      count = count - 1
    end
    table.insert(removed, owner)
    local _, _, _, held = parse(ARGV[i + 1])
    redis.call("HDEL", line.waiters, message_id(owner, held))
  end
end
local handed
handed, count = hand_over(key, line, holders, count)
expire_with_holders(key)
return {removed, handed, dropped}
