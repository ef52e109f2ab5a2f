-- A queued holder starts running: it gives up its place ("release") or keeps
-- it, now recorded as running ("run").
-- KEYS[1]: the enqueue lock, KEYS[2]: the replaced set (one digest, one hash slot).
-- ARGV: owner, "release" or "run", holder (for "run").
-- Returns 1 when the owner held a place, 0 when it held none (it lapsed), and
-- -1 when a newer message took its place (replace): then it must not run, and
-- gives up any place it took again since (a delayed copy or a retry coming due).
local key, owner = KEYS[1], ARGV[1]
if redis.call("SREM", KEYS[2], owner) == 1 then
  release(key, owner)
  return -1
end
local holders, count = live_holders(key)
local record = holders[owner]
if not record then
  expire_with_holders(key, holders, count)
  return 0
end
if ARGV[2] == "release" then
  write_holder(key, owner, false)
  holders[owner] = nil
  count = count - 1
else
  local expires_at, token, acquired_at = parse(record)
  record = format_record(expires_at, token, acquired_at, share_names(key, count - 1, ARGV[3]))
  write_holder(key, owner, record)
  holders[owner] = record
end
expire_with_holders(key, holders, count)
return 1
