-- Functions shared by every dramatiq_unique script. RedisBackend loads them once per
-- server with every script, as a library of Redis Functions, where the server has
-- them (scripts.py); elsewhere it puts this file in front of each script, called by SHA.
--
-- A lock is one HASH. Two fields are the lock's own: "fence" holds the last
-- fencing token issued, "names" the actor and queue its holders share (below).
-- Every other field is a holder: its owner -> its record. An owner that is
-- "fence" or "names" with any number of "@" in front (none included) takes one
-- more "@" in its field, so no holder's field is ever one of the lock's own
-- (holder_field, field_owner; every other owner is its own field, as it was
-- in earlier versions). A record is
--   "<token>|<late>|<lifetime>|<holder>"
-- where acquired_at is the token's millisecond less `late` (empty for 0) and
-- expires_at is acquired_at plus `lifetime` (empty: never), and a holder is
--   "<state><lock>[+]|<worker_id>|<redis_message_id>|<actor>|<queue>|<message_id>"
-- with one-letter codes for state and lock type, "+" for a replaceable holder,
-- an empty message_id for a holder whose field is its message_id, and an empty
-- actor and queue for those in the field "names" ("<actor>|<queue>", set by the
-- lock's first holder: the holders of a lock are nearly always of one actor and
-- queue).
-- Short records keep the hash in Redis' compact encoding. A record of an
-- earlier version, or of a holder with no compact form (Holder.encode), is
--   "<expires_at>|<token>|<acquired_at>|<holder JSON>"
-- and is read, and written again, as such. Times are in milliseconds of this
-- server's clock. The numbers stay outside the JSON because cjson cannot
-- encode 16-digit integers exactly.
--
-- RedisBackend defines FENCE_RETENTION (ms) in front of this file: how long
-- a lock's fence outlives its last holder; and UNHEALED_REFUSAL (ms): how long new
-- places are refused after a script found the store's data gone, unless a worker heals
-- it sooner or keeps refusing while it does.

local FENCE, NAMES = "fence", "names"
local ESCAPE = 64 -- "@", put in front of an owner named like a lock's own field
local JSON = 123 -- "{", the first byte of a holder in JSON

-- Whether `name`, less the "@" in front of it, is the name of a lock's own field.
local function lock_field_name(name)
  if string.byte(name) == ESCAPE then name = string.match(name, "^@*(.*)$") end
  return name == FENCE or name == NAMES
end

-- The field of `owner`'s record: never one of the lock's own fields.
local function holder_field(owner)
  if lock_field_name(owner) then return "@" .. owner end
  return owner
end

-- The owner whose record a field holds; nil for the lock's own fields.
local function field_owner(field)
  if field == FENCE or field == NAMES then return nil end
  if string.byte(field) == ESCAPE and lock_field_name(field) then return string.sub(field, 2) end
  return field
end

-- Each script reads the clock at most once, reads a lock's hash once (HGETALL)
-- and writes its fields in one HSET and one HDEL (stage, flush).

local now_ms, now_us = nil, nil

-- Returns now in milliseconds and in microseconds, the same throughout the script.
local function clock()
  if not now_ms then
    local time = redis.call("TIME")
    local seconds, micros = tonumber(time[1]), tonumber(time[2])
    now_ms, now_us = seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
  end
  return now_ms, now_us
end

-- The fence and names fields of each lock whose hash this script read (false: absent).
local known = {}
-- The locks whose hash this script found absent: one it creates has no expiry to take away.
local absent = {}
-- Each lock whose hash holds a record this version cannot read -> the first such field and its value.
local unreadable = {}
-- The waiters whose entry could not be read, dropped from their line: lock key, message id, ...
local dropped = {}
-- The field writes of each lock not sent yet: field -> value, false to delete.
local staged = {}

-- Forgets the clock read and the hashes read by an earlier call: a library of Redis
-- Functions keeps this file's state from one call to the next.
local function begin_call()
  now_ms, now_us, known, absent, staged, unreadable, dropped = nil, nil, {}, {}, {}, {}, {}
end

local function stage(key, field, value)
  if not staged[key] then staged[key] = {} end
  staged[key][field] = value
end

-- The lock's own field FENCE or NAMES.
local function lock_field(key, name)
  local fields = known[key]
  if fields then return fields[name] end
  return redis.call("HGET", key, name)
end

-- Sets the lock's own field FENCE or NAMES (false: deletes it).
local function write_lock_field(key, name, value)
  stage(key, name, value)
  if known[key] then known[key][name] = value end
end

-- Records `owner`'s place (false: gives it up).
local function write_holder(key, owner, record)
  stage(key, holder_field(owner), record)
end

local function flush(key)
  local fields = staged[key]
  if not fields then return end
  staged[key] = nil
  local set, delete = {}, {}
  for field, value in pairs(fields) do
    if value then
      table.insert(set, field)
      table.insert(set, value)
    else
      table.insert(delete, field)
    end
  end
  if #delete > 0 then redis.call("HDEL", key, unpack(delete)) end
  if #set > 0 then redis.call("HSET", key, unpack(set)) end
end

-- Returns expires_at (nil: never), token, acquired_at and the holder; nothing for a record
-- without the numbers of its form (live_holders also checks the holder: readable_holder).
local function parse(record)
  local a, b, c, holder = string.match(record, "^(-?%d*)|(-?%d*)|(-?%d*)|(.*)$")
  if not holder or holder == "" then return end
  if string.byte(holder) == JSON then
    local token, acquired_at = tonumber(b), tonumber(c)
    if not (token and acquired_at) then return end
    return tonumber(a), token, acquired_at, holder
  end
  local token, lifetime = tonumber(a), tonumber(c)
  if not token or (c ~= "" and not lifetime) then return end
  local acquired_at = (token - token % 1000) / 1000 - (tonumber(b) or 0)
  local expires_at = nil
  if lifetime then expires_at = acquired_at + lifetime end
  return expires_at, token, acquired_at, holder
end

-- Whether `holder` is one as Holder.encode writes it: compact, "<state><lock>[+]" and five
-- "|", or a JSON object with a message_id.
local function readable_holder(holder)
  if string.byte(holder) ~= JSON then
    return string.match(holder, "^[qr]%l%+?|[^|]*|[^|]*|[^|]*|[^|]*|") ~= nil
  end
  local ok, fields = pcall(cjson.decode, holder)
  return ok and type(fields) == "table" and type(fields.message_id) == "string"
end

-- Raises the error that RedisBackend reports as a lock holding what this version cannot read:
-- `found` is a field and its value. (A key of another type fails its first command: WRONGTYPE.)
local function refuse_unreadable(key, found)
  found.key = key
  error({err = "UNREADABLE " .. cjson.encode(found)})
end

local function format_record(expires_at, token, acquired_at, holder)
  if string.byte(holder) == JSON then
    local expiry = ""
    if expires_at then expiry = string.format("%d", expires_at) end
    return expiry .. "|" .. string.format("%d", token) .. "|" .. string.format("%d", acquired_at) .. "|" .. holder
  end
  local late, lifetime = (token - token % 1000) / 1000 - acquired_at, ""
  if expires_at then lifetime = string.format("%d", expires_at - acquired_at) end
  if late == 0 then late = "" else late = string.format("%d", late) end
  return string.format("%d", token) .. "|" .. late .. "|" .. lifetime .. "|" .. holder
end

-- The last token issued for the lock: its fence. A holder named "fence" of an
-- earlier version wrote its record over the fence: that record's token was the last.
local function last_token(key)
  local fence = lock_field(key, FENCE)
  if not fence then return 0 end
  local token = tonumber(fence)
  if token then return token end
  local _, overwritten = parse(fence)
  return overwritten
end

local function message_id(owner, holder)
  if string.byte(holder) == JSON then return cjson.decode(holder).message_id end
  local id = string.match(holder, "^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|(.*)$")
  if id == "" then return owner end
  return id
end

-- Whether a newer message may take the holder's place (replace): it is queued and replaceable.
local function replaceable(holder)
  if string.byte(holder) == JSON then
    return string.find(holder, '"replaceable":true', 1, true) and string.find(holder, '"state":"queued"', 1, true)
  end
  local flags = string.match(holder, "^[^|]*")
  return string.sub(flags, 1, 1) == "q" and string.sub(flags, -1) == "+"
end

-- The holder to record for a lock with `count` other holders: without its
-- actor and queue when they are the lock's names. The first holder sets them;
-- they never change while a holder relies on them.
local function share_names(key, count, holder)
  if string.byte(holder) == JSON then return holder end
  local head, names, id = string.match(holder, "^([^|]*|[^|]*|[^|]*)|([^|]+|[^|]+)|(.*)$")
  if not head then return holder end
  if count == 0 then
    write_lock_field(key, NAMES, names)
  elseif lock_field(key, NAMES) ~= names then
    return holder
  end
  return head .. "|||" .. id
end

-- Remembers the first field of the lock's hash that this version cannot read (live_holders).
local function mark_unreadable(key, field, value)
  if not unreadable[key] then unreadable[key] = {field = field, value = value} end
end

-- Drops the holders whose place lapsed; returns the others (owner -> record), their count, and
-- how many lapsed places it kept. Lapse is judged by the server clock now (read only if a
-- place may lapse): after that clock stepped back, a lapsed place that no script dropped yet
-- counts again until the clock passes its expiry once more, as Redis' own key expiry does with
-- keys. A script that cannot hand a freed place to the lock's line (it has not its keys) passes
-- `keep_lapsed`: the lapsed places stay, not counted, for a step that hands them over (a
-- release, a start, a new send, the orphan reaper), so that no waiter is forgotten.
--
-- A record this version cannot read (another version's, a hand edit) is neither dropped nor
-- counted as a holder: the lock is marked unreadable, so that no place is taken or handed
-- beside a holder that cannot be told apart from a free place (reject_unreadable), while its
-- readable holders may still give theirs up.
local function live_holders(key, keep_lapsed)
  local fields = redis.call("HGETALL", key)
  local holders, count, kept = {}, 0, 0
  local lock = {[FENCE] = false, [NAMES] = false}
  for i = 1, #fields, 2 do
    local field, record = fields[i], fields[i + 1]
    local owner = field_owner(field)
    if not owner then
      lock[field] = record
      -- The fence, or the record of an earlier version's holder named "fence" (last_token).
      if field == FENCE and not tonumber(record) and not select(2, parse(record)) then
        mark_unreadable(key, field, record)
      end
    else
      local expires_at, token, _, holder = parse(record)
      if not token or not readable_holder(holder) then
        mark_unreadable(key, field, record)
      elseif expires_at and expires_at <= clock() then
        if keep_lapsed then kept = kept + 1 else write_holder(key, owner, false) end
      else
        holders[owner] = record
        count = count + 1
      end
    end
  end
  known[key] = lock
  absent[key] = #fields == 0
  return holders, count, kept
end

-- Refuses a new place in a lock that holds a record this version cannot read (live_holders),
-- naming the record with the first SHOWN bytes of its value.
local SHOWN = 100
local function reject_unreadable(key)
  local found = unreadable[key]
  if found then
    refuse_unreadable(key, {field = found.field, value = string.sub(found.value, 1, SHOWN), cut = #found.value > SHOWN})
  end
end

-- The key lives as long as its longest-lived holder, then FENCE_RETENTION ms
-- more, and at least until FENCE_RETENTION past its last token's time. Once
-- its last holder left, the key keeps its fence alone: expiry follows the
-- server clock, so the key is still there after that clock stepped back by
-- less than FENCE_RETENTION, and tokens keep increasing.
local function expire_with_holders(key, holders, count)
  -- A lock that holds a record this version cannot read keeps its fields and an expiry at least
  -- as late as it had: that record may be of a holder that never lapses.
  local keeps_unreadable = unreadable[key] ~= nil
  if count == 0 and not keeps_unreadable and lock_field(key, NAMES) then write_lock_field(key, NAMES, false) end
  flush(key)
  if count == 0 and not keeps_unreadable and lock_field(key, FENCE) then
    -- A hash that held a record longer than hash-max-listpack-value (a run
    -- lock's, with a worker id and a message id) keeps Redis' large encoding;
    -- restored, a hash of one short field takes the compact one: half the memory.
    -- (Deleting it and writing it again is refused by Redis Cluster while the
    -- key's slot migrates.) An ACL user may be denied RESTORE: the key then stays
    -- as it is. A hash that is compact already (nearly every enqueue lock) needs
    -- no DUMP and RESTORE.
    local encoding = redis.pcall("OBJECT", "ENCODING", key)
    if encoding == "hashtable" then
      local dumped = redis.pcall("DUMP", key)
      if type(dumped) == "string" then redis.pcall("RESTORE", key, 0, dumped, "REPLACE") end
    end
  end
  local latest = 0
  if not keeps_unreadable then latest = math.floor(last_token(key) / 1000) end
  for _, record in pairs(holders) do
    local expires_at = parse(record)
    if not expires_at then
      if not absent[key] then redis.call("PERSIST", key) end
      return
    end
    if expires_at > latest then latest = expires_at end
  end
  if keeps_unreadable then
    local left = redis.call("PTTL", key)
    if left == -1 or clock() + left >= latest + FENCE_RETENTION then return end
  end
  redis.call("PEXPIREAT", key, latest + FENCE_RETENTION)
end

-- Whether new places are refused because the store lost its data and heals: `refusal`
-- is the key that exists while it heals (nil: the caller takes places for the healing
-- itself). `mark` is the key of the store's mark, which the caller saw written (nil: not
-- known to exist): gone, it went with the data since, and this script is the first to
-- tell. It writes the mark again, so that workers find the loss at their next heartbeat,
-- and refuses new places for UNHEALED_REFUSAL ms, or until a worker healed the store.
local function new_places_refused(refusal, mark)
  if not refusal then return false end
  if not mark then return redis.call("EXISTS", refusal) == 1 end
  -- One look at both: a refusal refuses, the mark alone is the usual answer, neither a loss.
  local found = redis.call("MGET", refusal, mark)
  if found[1] then return true end
  if not found[2] then
    local _, now_us = clock()
    redis.call("SET", mark, "lost at " .. now_us)
    redis.call("SET", refusal, "lost at " .. now_us, "PX", UNHEALED_REFUSAL)
    return true
  end
  return false
end

-- Takes one of the `limit` places of the lock for `owner`, or keeps the place
-- `owner` has and pushes its expiry back to at least `ttl + extend` from now.
-- Returns {1, token, expires_at or 0}, {0, message_id of each holder} when
-- the other holders fill every place or the holder's message has a place already,
-- or {-2} when the place would be new and new places are `refused` (new_places_refused).
-- `holders` and `count` are the lock's live holders (live_holders), updated here.
local function take_place(key, owner, limit, ttl, extend, holder, refused, holders, count)
  reject_unreadable(key)
  local now, now_us = clock()
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
      for holder_owner, record in pairs(holders) do
        local _, _, _, held = parse(record)
        table.insert(reply, message_id(holder_owner, held))
      end
      return reply
    end
    if count > 0 then
      -- A message holds at most one place: a redelivery of a message that still runs
      -- elsewhere (a new owner, the same message) meets its earlier attempt.
      local id = message_id(owner, holder)
      for holder_owner, record in pairs(holders) do
        local _, _, _, held = parse(record)
        if message_id(holder_owner, held) == id then
          return {0, id}
        end
      end
    end
    if refused then
      return {-2}
    end
    -- Tokens follow the server clock in microseconds, so they keep
    -- increasing even after the key (and its fence) went with its last holder.
    token = math.max(last_token(key) + 1, now_us)
    acquired_at = now
    write_lock_field(key, FENCE, string.format("%d", token))
    count = count + 1
  end

  local record = format_record(expires_at, token, acquired_at, share_names(key, count - 1, holder))
  write_holder(key, owner, record)
  holders[owner] = record
  return {1, token, expires_at or 0}, count
end

local function acquire(key, owner, limit, ttl, extend, holder, refused)
  local holders, count = live_holders(key)
  local reply, taken = take_place(key, owner, limit, ttl, extend, holder, refused, holders, count)
  expire_with_holders(key, holders, taken or count)
  return reply
end

-- Whether a holder's place is recorded as queued: in a run lock, only a place its line handed.
local function queued(record)
  local _, _, _, holder = parse(record)
  if string.byte(holder) == JSON then return string.find(holder, '"state":"queued"', 1, true) ~= nil end
  return string.byte(holder) == 113 -- "q"
end

-- Lines (on_conflict "wait" and "keep_latest"). A lock's line is a LIST of the ids of the
-- messages that wait for one of its places, in the order they came. The digest's waiters
-- HASH holds each of them: id -> "<limit>\n<holder>\n<message>", the number of places of the
-- lock it waits for, the holder to record for it and the message itself, encoded. The script
-- that frees a place hands it to the head of the line, recorded as queued and never lapsing,
-- with the message id for owner, and answers "<token>\n<message>", which its caller enqueues
-- stamped with the place's token: only the copy so stamped may take the place. The message
-- stays among the waiters until it starts, so that the orphan reaper can enqueue it again if it
-- went missing on its way (with the place's token renewed: the copy it replaces, if it exists
-- after all, may not take it any more). When it starts, the digest's served ZSET keeps its id,
-- scored by the token it started with, for SERVED_RETENTION ms: a copy with another token, or
-- none (the message it was before it joined the line, redelivered), never runs; a redelivery
-- of the copy that started, after its worker died, does.

-- A lock's line: the keys of its list, of the digest's waiters and of its served copies (nil: none).
local function line_at(list, waiters, served)
  if not list then return nil end
  return {list = list, waiters = waiters, served = served}
end

-- Returns the limit, holder and message of a waiter's entry; nothing for an entry that is not
-- one (another version's, a hand edit).
local function parse_waiter(entry)
  local limit, holder, message = string.match(entry, "^(%d+)\n([^\n]*)\n(.*)$")
  if not limit or holder == "" or not readable_holder(holder) then return end
  return tonumber(limit), holder, message
end

-- Drops message `id` of the lock at `key` from the waiters, whose entry could not be read: its
-- caller reports it (the dropped waiters are in each reply of a script that hands places over).
local function drop_waiter(key, line, id)
  redis.call("HDEL", line.waiters, id)
  table.insert(dropped, key)
  table.insert(dropped, id)
end

-- Hands the free places of the lock to the head of its line, in order, dropping each waiter
-- whose entry cannot be read. Returns the messages handed a place, and the lock's new count of
-- holders. A lock that holds a record this version cannot read hands nothing: its line waits.
local function hand_over(key, line, holders, count)
  local handed = {}
  if not line or unreadable[key] then return handed, count end
  while true do
    local head = redis.call("LINDEX", line.list, 0)
    if not head then break end
    local entry = redis.call("HGET", line.waiters, head)
    -- A waiter that was let go (an operator freed it) or that holds a place already leaves.
    if entry and holders[head] then redis.call("HDEL", line.waiters, head) end
    local limit, holder, message = nil, nil, nil
    if entry and not holders[head] then
      limit, holder, message = parse_waiter(entry)
      if not limit then drop_waiter(key, line, head) end
    end
    if limit then
      if count >= limit then break end
      local now, now_us = clock()
      local token = math.max(last_token(key) + 1, now_us)
      write_lock_field(key, FENCE, string.format("%d", token))
      local record = format_record(nil, token, now, share_names(key, count, holder))
      write_holder(key, head, record)
      holders[head] = record
      count = count + 1
      table.insert(handed, string.format("%d", token) .. "\n" .. message)
    end
    redis.call("LPOP", line.list)
  end
  return handed, count
end

-- How many messages wait in the line, for a caller without a broker (`no_broker` "1"), which
-- frees no place of such a lock: the message handed it would never be enqueued. 0 otherwise.
local function without_broker_waiting(line, no_broker)
  if no_broker ~= "1" or not line then return 0 end
  return redis.call("LLEN", line.list)
end

-- Whether message `id`, as the copy a line handed the place of token `copy` ("" for one no
-- line handed a place), must not start: another copy of it started after it waited in line.
local function served_before(line, id, copy)
  if not line then return false end
  local started = redis.call("ZSCORE", line.served, id)
  return started ~= false and tonumber(started) ~= tonumber(copy)
end

-- Whether message `id`'s queued `place` is the one a line handed to another copy than `copy`
-- (a reaper that enqueued the message again renewed its token). Who may run a handed place is
-- decided by this rule: a handoff is pending while the lock holds a queued place of the message
-- AND the message is still among the digest's waiters; only the copy stamped with that place's
-- token takes it. A queued place without a waiter entry is no handoff, whatever its token: the
-- place a retry took again at enqueue, or one the healing took again after the store lost its
-- data (which lost the waiters too). Once a copy started (serve), the served copies say which
-- one may start again (served_before): its retries and redeliveries do, no other copy.
local function handed_to_another(line, id, place, copy)
  if not place or copy == "" or not queued(place) then return false end
  local _, token = parse(place)
  return token ~= tonumber(copy) and line ~= nil and redis.call("HEXISTS", line.waiters, id) == 1
end

-- Message `id` starts as the copy `copy`: it leaves the waiters, if it was one, and a copy
-- handed a place is remembered as the one that started.
local function serve(line, id, copy)
  if line and redis.call("HDEL", line.waiters, id) == 1 and copy ~= "" then
    local _, now_us = clock()
    redis.call("ZREMRANGEBYSCORE", line.served, "-inf", now_us - SERVED_RETENTION * 1000)
    redis.call("ZADD", line.served, copy, id)
    redis.call("PEXPIRE", line.served, SERVED_RETENTION)
  end
end

-- Puts message `id` at the end of the lock's line. Returns {3, its place in the line, the id
-- of the waiter whose place it took when the line was full and the newest `keeps_latest`
-- (else "")}, or {-4} when the line is full.
local function join(line, id, entry, line_limit, keeps_latest)
  -- A message that waits again (a retry that met the lock) starts again as the copy handed next.
  redis.call("ZREM", line.served, id)
  local size = redis.call("LLEN", line.list)
  if size < line_limit then
    redis.call("RPUSH", line.list, id)
    redis.call("HSET", line.waiters, id, entry)
    return {3, size + 1, ""}
  end
  if keeps_latest and size > 0 then
    local last = redis.call("LINDEX", line.list, -1)
    redis.call("HDEL", line.waiters, last)
    redis.call("LSET", line.list, -1, id)
    redis.call("HSET", line.waiters, id, entry)
    return {3, size, last}
  end
  return {-4}
end

-- Takes a place for `owner` as take_place does, or puts its message in the lock's line when
-- every place is taken or others wait already. `mode` is "send" for a message sent, "start"
-- for one that starts as `copy` (served_before): the copy its line handed a place takes it, and
-- another copy of that message is answered {-3}. A message that waits already is answered its place in
-- the line. A conflict names the holders after join's reply (a full line: {-4, holders}); a
-- message meeting a place of its own (a redelivery meeting its earlier attempt) never joins.
-- Returns the reply, the messages handed a place, and the lock's holders and their count.
local function take_or_wait(key, line, owner, limit, ttl, extend, holder, refused, mode, copy, entry, line_limit,
                            keeps_latest)
  local id = message_id(owner, holder)
  local holders, count = live_holders(key)
  reject_unreadable(key)
  local handed
  handed, count = hand_over(key, line, holders, count)
  local reserved = false
  if mode == "start" then
    local place = holders[id]
    -- In a run lock, a queued place is one its line handed: only the copy stamped with its token
    -- takes it, never another, nor the message as it was before it joined the line.
    local handed_token = nil
    if place and owner ~= id and queued(place) then handed_token = select(2, parse(place)) end
    if served_before(line, id, copy) or (handed_token and handed_token ~= tonumber(copy)) then
      return {-3}, handed, holders, count
    end
    if handed_token then
      -- The place its line handed this message: the message takes it as its own.
      write_holder(key, id, false)
      holders[id] = nil
      count, reserved = count - 1, true
    end
  end
  if not reserved and not holders[owner] and redis.call("HEXISTS", line.waiters, id) == 1 then
    local at = redis.call("LPOS", line.list, id)
    if at then return {3, at + 1, ""}, handed, holders, count end
  end
  local reply
  if not reserved and not holders[owner] and redis.call("LLEN", line.list) > 0 then
    reply = {0} -- those in line come first
    for holder_owner, record in pairs(holders) do
      local _, _, _, held = parse(record)
      table.insert(reply, message_id(holder_owner, held))
    end
  else
    local taken
    reply, taken = take_place(key, owner, limit, ttl, extend, holder, refused, holders, count)
    count = taken or count
  end
  if reply[1] == 0 then
    local own = false
    for i = 2, #reply do
      if reply[i] == id then own = true end
    end
    if not own then
      local joined = join(line, id, entry, line_limit, keeps_latest)
      for i = 2, #reply do table.insert(joined, reply[i]) end
      reply = joined
    end
  elseif reply[1] == 1 and mode == "start" then
    serve(line, id, copy)
  end
  return reply, handed, holders, count
end

-- Gives up `owner`'s place and hands the free places to the line. Its message leaves the
-- waiters too, unless it `stays_waiting` (it joined another line). Returns 1, or 0 when it
-- held none (a lapsed place that no script dropped yet counts as none), and the messages
-- handed a place.
local function release_place(key, line, owner, stays_waiting)
  local holders, count = live_holders(key)
  local removed = 0
  local record = holders[owner]
  if record then
    write_holder(key, owner, false)
    holders[owner] = nil
    count, removed = count - 1, 1
    if line and not stays_waiting then
      local _, _, _, held = parse(record)
      redis.call("HDEL", line.waiters, message_id(owner, held))
    end
  elseif line and redis.call("LREM", line.list, 0, owner) > 0 then
    -- It waited without a place (a send whose answer was lost, given up): it leaves the line.
    redis.call("HDEL", line.waiters, owner)
  end
  local handed
  handed, count = hand_over(key, line, holders, count)
  expire_with_holders(key, holders, count)
  return removed, handed
end

local function release(key, owner)
  return (release_place(key, nil, owner))
end

-- Renews a lease: pushes `owner`'s expiry back to `ttl` ms from now, never past `deadline`
-- (0: none) and never earlier than it was. Owner-checked. Writes the lock's changes (flush),
-- so that a script may renew the leases of many locks, one after the other.
-- Returns the new expiry, 0 for a place that never lapses, -1 when owner holds no place.
local function renew_place(key, owner, ttl, deadline)
  local now = clock()
  local holders, count, kept = live_holders(key, true)
  local record = holders[owner]
  if not record then
    expire_with_holders(key, holders, count + kept)
    return -1
  end
  local expires_at, token, acquired_at, holder = parse(record)
  if expires_at then
    local target = now + ttl
    if deadline > 0 and target > deadline then target = deadline end
    if target > expires_at then
      expires_at = target
      record = format_record(expires_at, token, acquired_at, holder)
      write_holder(key, owner, record)
      holders[owner] = record
    end
  end
  expire_with_holders(key, holders, count + kept)
  return expires_at or 0
end
