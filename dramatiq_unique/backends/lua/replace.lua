-- Takes a place like acquire; when every place is taken, first takes the place
-- of the oldest holder that is still queued and replaceable (never one that runs) and
-- remembers that holder in the replaced set, so it is skipped when it starts.
-- KEYS[1]: the enqueue lock, KEYS[2]: the replaced set, KEYS[3]: the deadline of a series of
-- debounced sends (one digest, one hash slot); KEYS[4] on: the keys of its hash slot
-- (read_for_place).
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder, replaced set TTL in ms,
-- debounce cap in ms (0: not debounced).
-- Returns acquire's reply; a new place adds the replaced owner (false: none) and, when debounced,
-- the ms within which it is due at the latest. Where a line was handed places first, the reply is
-- {that reply, the messages handed a place, the waiters dropped}, as acquire answers it.
local key, replaced_key, owner, limit = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2])
local value, refused = read_for_place({key, unpack(KEYS, 4)}, 2)
local holders, count = live_holders(key, false, value)
reject_unreadable(key) -- before a holder is replaced
-- Those in line (an actor that shares the lock and waits) are handed free places before anyone
-- is replaced.
local handed
handed, count = hand_over_first(key, holders, count)
local held_before = holders[owner] ~= nil
local victim = nil
if count >= limit and not held_before and not refused then
  local oldest = nil
  for holder_owner, record in pairs(holders) do
    local _, token, _, holder = parse(record)
    -- Only a queued holder that checks the replaced set when it starts may lose its place.
    if replaceable(holder) and (oldest == nil or token < oldest) then
      victim, oldest = holder_owner, token
    end
  end
  if victim then
    write_holder(key, victim, false)
    holders[victim] = nil
    count = count - 1
    redis.call("SADD", replaced_key, victim)
    redis.call("PEXPIRE", replaced_key, tonumber(ARGV[6]))
  end
end
local reply = take_place(key, owner, limit, tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], refused, holders, count)
expire_with_holders(key)
local answer = reply
if handed ~= NOTHING or #dropped > 0 then answer = {reply, handed, dropped} end
if reply[1] ~= 1 or held_before then return answer end
reply[4] = victim or false
local cap = tonumber(ARGV[7])
if cap > 0 then
  local now = clock()
  if victim then
    -- The series goes on until its deadline. Gone, it passed: the series is due now.
    local deadline = tonumber(redis.call("GET", KEYS[3]))
    reply[5] = 0
    if deadline then reply[5] = math.max(0, deadline - now) end
  else
    redis.call("SET", KEYS[3], string.format("%d", now + cap), "PX", cap)
    reply[5] = cap
  end
end
return answer
