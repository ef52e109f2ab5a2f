-- Takes a place like acquire; when every place is taken, first takes the place
-- of the oldest holder that is still queued and replaceable (never one that runs) and
-- remembers that holder in the replaced set, so it is skipped when it starts.
-- KEYS[1]: the enqueue lock, KEYS[2]: the replaced set (one digest, one hash slot);
-- KEYS[3], KEYS[4]: the refusal and the mark (new_places_refused), or none.
-- ARGV: owner, limit, ttl in ms (0: never lapses), extend in ms, holder, replaced set TTL in ms.
-- Returns acquire's reply, with the replaced owner appended when there was one.
local key, replaced_key, owner, limit = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2])
local refused = new_places_refused(KEYS[3], KEYS[4])
local holders, count = live_holders(key)
local victim = nil
if count >= limit and not holders[owner] and not refused then
  local oldest = nil
  for holder_owner, record in pairs(holders) do
    local _, token, _, holder = parse(record)
    -- Only a queued holder that checks the replaced set when it starts may lose its place.
    if replaceable(holder) and (oldest == nil or token < oldest) then
      victim, oldest = holder_owner, token
    end
  end
  if victim then
    redis.call("HDEL", key, holder_field(victim))
    redis.call("SADD", replaced_key, victim)
    redis.call("PEXPIRE", replaced_key, tonumber(ARGV[6]))
  end
end
local reply = acquire(key, owner, limit, tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], refused)
if victim and reply[1] == 1 then
  table.insert(reply, victim)
end
return reply
