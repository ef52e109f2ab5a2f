-- flags: allow-oom
-- A queued holder starts running: it gives up its place ("release") or keeps
-- it, now recorded as running ("run").
-- KEYS[1]: the enqueue lock, KEYS[2]: the format key of its hash slot (open_slot), and KEYS[3]:
-- the replaced set, only for a message whose actor replaces queued holders (none other can have
-- lost its place to a newer one); one digest, one hash slot. Its line is named after it (line_of).
-- ARGV: owner, "release" or "run", holder (for "run"), the copy of the message (served_before).
-- Returns {1 when the owner held a place, 0 when it held none (it lapsed), -1 when a newer
-- message took its place (replace), or -3 when this copy of it started before (a line's): it
-- must not run; the messages the line was handed; the waiters dropped (hand_over)}. A replaced
-- message gives up any place it took again since (a delayed copy or a retry coming due).
local key, owner = KEYS[1], ARGV[1]
local line = line_of(key)
open_slot(KEYS[2])
if KEYS[3] and redis.call("SREM", KEYS[3], owner) == 1 then
  local _, handed = release_place(key, line, owner, false)
  return {-1, handed, dropped}
end
if ARGV[2] == "release" and ARGV[4] == "" then
  -- until_executing: the start gives the place up, as a release does.
  local answer, handed = release_place(key, line, owner, false)
  return {answer, handed, dropped}
end
local holders, count = live_holders(key)
local record = holders[owner]
-- Only a copy a line handed a place is checked: every other start (nearly all) costs no ZSCORE.
if ARGV[4] ~= "" and (served_before(line, owner, ARGV[4]) or handed_to_another(line, owner, record, ARGV[4])) then
  -- This copy takes nothing, but the places that lapsed go to the line, as at any other start.
  local handed = hand_over(key, line, holders, count)
  expire_with_holders(key)
  return {-3, handed, dropped}
end
local answer = 0
if record then
  answer = 1
  serve(line, owner, ARGV[4])
  if ARGV[2] == "release" then
    write_holder(key, owner, false)
    holders[owner] = nil
    count = count - 1
  else
    local expires_at, token, acquired_at = parse(record)
    record = format_record(expires_at, token, acquired_at, ARGV[3])
    write_holder(key, owner, record)
    holders[owner] = record
  end
end
local handed
handed, count = hand_over(key, line, holders, count)
expire_with_holders(key)
return {answer, handed, dropped}
