-- Functions shared by every dramatiq_unique script; RedisBackend puts this
-- file in front of each script before registering it.
--
-- A lock is one HASH. Its field "fence" holds the last fencing token issued;
-- every other field is a holder: owner -> "<expires_at>|<token>|<acquired_at>|<holder JSON>",
-- in milliseconds of this server's clock, with an empty expires_at for a
-- place that never lapses. The numbers stay outside the JSON because cjson
-- cannot encode 16-digit integers exactly.
--
-- RedisBackend defines FENCE_RETENTION (ms) in front of this file: how long
-- a lock's fence outlives its last holder.

local FENCE = "fence"

-- Returns now in milliseconds and in microseconds.
local function clock()
  local time = redis.call("TIME")
  local seconds, micros = tonumber(time[1]), tonumber(time[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
end

local function parse(record)
  local expires_at, token, acquired_at, holder = string.match(record, "^(%d*)|(%d+)|(%d+)|(.*)$")
  return tonumber(expires_at), tonumber(token), tonumber(acquired_at), holder
end

local function format_record(expires_at, token, acquired_at, holder)
  local expiry = ""
  if expires_at then expiry = string.format("%d", expires_at) end
  return expiry .. "|" .. string.format("%d", token) .. "|" .. string.format("%d", acquired_at) .. "|" .. holder
end

-- Drops the holders whose place lapsed; returns the others (owner -> record) and their count.
-- Lapse is judged by the server clock now: after that clock stepped back, a
-- lapsed place that no script dropped yet counts again until the clock passes
-- its expiry once more, as Redis' own key expiry does with keys.
local function live_holders(key, now)
  local fields = redis.call("HGETALL", key)
  local holders, count = {}, 0
  for i = 1, #fields, 2 do
    local owner, record = fields[i], fields[i + 1]
    if owner ~= FENCE then
      local expires_at = parse(record)
      if expires_at and expires_at <= now then
        redis.call("HDEL", key, owner)
      else
        holders[owner] = record
        count = count + 1
      end
    end
  end
  return holders, count
end

-- The key lives as long as its longest-lived holder, then FENCE_RETENTION ms
-- more, and at least until FENCE_RETENTION past its last token's time. Once
-- its last holder left, the key keeps its fence alone: expiry follows the
-- server clock, so the key is still there after that clock stepped back by
-- less than FENCE_RETENTION, and tokens keep increasing.
local function expire_with_holders(key, holders, count)
  local fence = redis.call("HGET", key, FENCE)
  if count == 0 and fence then
    -- Restored, a hash of one short field takes the compact encoding: half the
    -- memory of one that held records. (Deleting it and writing it again is
    -- refused by Redis Cluster while the key's slot migrates.) An ACL user may be
    -- denied RESTORE: the key then stays as it is.
    local dumped = redis.pcall("DUMP", key)
    if type(dumped) == "string" then redis.pcall("RESTORE", key, 0, dumped, "REPLACE") end
  end
  local latest = math.floor((tonumber(fence) or 0) / 1000)
  for _, record in pairs(holders) do
    local expires_at = parse(record)
    if not expires_at then
      redis.call("PERSIST", key)
      return
    end
    if expires_at > latest then latest = expires_at end
  end
  redis.call("PEXPIREAT", key, latest + FENCE_RETENTION)
end

-- Takes one of the `limit` places of the lock for `owner`, or keeps the place
-- `owner` has and pushes its expiry back to at least `ttl + extend` from now.
-- Returns {1, token, expires_at or 0}, or {0, message_id of each holder} when
-- the other holders fill every place or the holder's message has a place already.
local function acquire(key, owner, limit, ttl, extend, holder)
  local now, now_us = clock()
  local holders, count = live_holders(key, now)
  local expires_at = nil
  if ttl > 0 then expires_at = now + ttl + extend end

  local token, acquired_at
  local current = holders[owner]
  if current then
    local current_expiry
    current_expiry, token, acquired_at = parse(current)
    if current_expiry == nil or expires_at == nil then
      expires_at = nil
    else
      expires_at = math.max(current_expiry, expires_at)
    end
  else
    if count >= limit then
      local reply = {0}
      for _, record in pairs(holders) do
        local _, _, _, holder_json = parse(record)
        table.insert(reply, cjson.decode(holder_json).message_id)
      end
      expire_with_holders(key, holders, count)
      return reply
    end
    if count > 0 then
      -- A message holds at most one place: a redelivery of a message that still runs
      -- elsewhere (a new owner, the same message) meets its earlier attempt.
      local message_id = cjson.decode(holder).message_id
      for _, record in pairs(holders) do
        local _, _, _, holder_json = parse(record)
        if cjson.decode(holder_json).message_id == message_id then
          expire_with_holders(key, holders, count)
          return {0, message_id}
        end
      end
    end
    -- Tokens follow the server clock in microseconds, so they keep
    -- increasing even after the key (and its fence) went with its last holder.
    local last = tonumber(redis.call("HGET", key, FENCE)) or 0
    token = math.max(last + 1, now_us)
    acquired_at = now
    redis.call("HSET", key, FENCE, string.format("%d", token))
    count = count + 1
  end

  local record = format_record(expires_at, token, acquired_at, holder)
  redis.call("HSET", key, owner, record)
  holders[owner] = record
  expire_with_holders(key, holders, count)
  return {1, token, expires_at or 0}
end

-- Gives up `owner`'s place; returns 1, or 0 when it held none (a lapsed place
-- that no script dropped yet counts as none).
local function release(key, owner)
  local holders, count = live_holders(key, clock())
  local removed = 0
  if holders[owner] then
    redis.call("HDEL", key, owner)
    holders[owner] = nil
    count, removed = count - 1, 1
  end
  expire_with_holders(key, holders, count)
  return removed
end
