-- Takes a place in the run lock and, only if that worked, gives up the
-- enqueue lock's place, in one step (until_and_while_executing).
-- KEYS[1]: the enqueue lock, KEYS[2]: the run lock, KEYS[3]: the replaced set
-- (one digest, one hash slot); KEYS[4], KEYS[5]: the refusal and the mark
-- (new_places_refused), or none.
-- ARGV: enqueue owner, run owner, limit, ttl in ms (0: never lapses), holder.
-- Returns acquire's reply, or {-1} when a newer message took the enqueue owner's place:
-- then any place it took again since (a delayed copy or a retry coming due) is given up.
if redis.call("SREM", KEYS[3], ARGV[1]) == 1 then
  release(KEYS[1], ARGV[1])
  return {-1}
end
local refused = new_places_refused(KEYS[4], KEYS[5])
local reply = acquire(KEYS[2], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), 0, ARGV[5], refused)
if reply[1] == 1 then
  release(KEYS[1], ARGV[1])
end
return reply
