-- Takes a place in a lock whose messages wait in line when every place is taken (take_or_wait).
-- KEYS[1]: the lock; KEYS[2], KEYS[3], KEYS[4]: its line (line_at); KEYS[5] on: the keys of its
-- hash slot (read_for_place).
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder, mode ("send" or
-- "start"), copy, waiter entry, line limit, "1" when the newest keeps the last place of a full line.
-- Returns {take_or_wait's reply, the messages handed a place, the waiters dropped (hand_over)}.
local key = KEYS[1]
local value, refused = read_for_place(KEYS, 5)
local reply, handed = take_or_wait(
  key, line_at(KEYS[2], KEYS[3], KEYS[4]), ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  ARGV[5], refused, ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9]), ARGV[10] == "1", value)
expire_with_holders(key)
return {reply, handed, dropped}
