-- Functions shared by every dramatiq_unique script. RedisBackend loads them once per
-- server with every script, as a library of Redis Functions, where the server has
-- them (scripts.py); elsewhere it puts this file in front of each script, called by SHA.
--
-- A lock is one STRING: the records of its holders, oldest first, one per line, and in front a
-- line "~" while messages wait in the lock's line (so that a release looks at the line's keys
-- only then). A record is
--   "<owner>|<token>|<late>|<lifetime>|<holder>"
-- with "%", "|" and newlines in the owner written %25, %7C and %0A (escape), where acquired_at
-- is the token's millisecond less `late` (empty for 0) and expires_at is acquired_at plus
-- `lifetime` (empty: never), and a holder is
--   "<state><lock>[!][+][*]|<worker_id>|<redis_message_id>|<actor>|<queue>|<message_id>[|<call>[|<by>]]"
-- with one-letter codes for state and lock type, "!" for a running holder asked to stop,
-- "+" for a replaceable holder, "*" for one
-- whose place a line handed it (its message is among the waiters until it starts), each value
-- escaped as the owner is (Holder.encode), an empty message_id for a holder whose owner is
-- its message_id, the holder's call only for an actor with lock_info, and who asked a holder
-- marked "!" to stop, only for it (its call empty then, without lock_info); in these last two
-- "*" is escaped too, as %2A. A script that writes a holder again keeps it whole, call and
-- request included. The key expires with its longest-lived holder and goes with its last one.
--
-- Fencing tokens follow the server's clock in microseconds and, through a clock that steps back,
-- the last token issued in the lock's hash slot, which the slot's format key under the lock
-- prefix keeps: a lock keeps nothing once its last holder left. That key holds
-- "<FORMAT> <version that wrote it> <last token>": a process finds another format in the read
-- it makes anyway, and refuses to write.
--
-- RedisBackend defines, in front of this file: FORMAT, the format of this file's records, and
-- WRITER, the version that writes them; LINE_RETENTION (ms): how long a lock whose line has
-- messages waiting outlives its longest-lived holder, for the script that hands the place on;
-- and UNHEALED_REFUSAL (ms): how long new places are refused after a script found the store's
-- data gone, unless a worker heals it sooner or keeps refusing while it does.

local WAITS = "~" -- the first line of a lock whose line has messages waiting
local NOTHING = {} -- no message handed a place: never written to
local HANDED = 42 -- "*", the last flag of a holder whose place a line handed it

-- `text` as a record holds it: "%", "|" and newlines escaped.
-- (Plain finds: a pattern with a class costs ten times as much on the hot path.)
local function escape(text)
  if not (string.find(text, "%", 1, true) or string.find(text, "|", 1, true) or string.find(text, "\n", 1, true)) then
    return text
  end
  return (string.gsub(text, "[%%|\n]", {["%"] = "%25", ["|"] = "%7C", ["\n"] = "%0A"}))
end

local function unescape(text)
  if not string.find(text, "%", 1, true) then return text end
  return (string.gsub(text, "%%(%x%x)", function(code) return string.char(tonumber(code, 16)) end))
end

-- Each script reads the clock at most once, reads a lock once (GET) and writes it once.

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

-- Each lock this script read: owners (in the order of the record), records (owner -> record,
-- false once given up), lines kept as they were (records this version cannot read, lapsed places
-- kept for a script that hands them on), whether messages wait in its line, whether it existed
-- and whether it changed.
local locks = {}
-- Each lock whose value holds a record this version cannot read -> the first such line.
local unreadable = {}
-- The waiters whose entry could not be read, dropped from their line: lock key, message id, ...
local dropped = {}
-- The hash slot's format key of the locks this script takes places in (open_slot), the last
-- token issued there (nil: not read yet), and whether a token was issued.
local slot = nil

-- Forgets the clock read and the locks read by an earlier call: a library of Redis
-- Functions keeps this file's state from one call to the next.
local function begin_call()
  now_ms, now_us, locks, unreadable, dropped, slot = nil, nil, {}, {}, {}, nil
end

-- Raises the error that RedisBackend reports as records under the prefix of a newer format.
local function refuse_format(found)
  error({err = "FORMAT " .. found})
end

-- The format key's value written by this file, less the last token: "<FORMAT> <WRITER> ".
local OWN_FORMAT = FORMAT .. " " .. WRITER .. " "
local OWN_NUMBER = FORMAT .. " "

-- The last token of a format key's value `found` (false: absent), which must be of this
-- file's format, whichever version wrote it.
local function last_token(found)
  if not found then return 0 end
  if string.sub(found, 1, #OWN_NUMBER) ~= OWN_NUMBER then refuse_format(found) end
  local token = tonumber(string.match(found, "(%d+)$"))
  if not token then refuse_format(found) end
  return token
end

-- The hash slot's format key `format`: "<format> <version that wrote it> <last token issued in
-- the slot>" (nil: a script that issues no new token, or only where a line waits). `found` is
-- its value if the caller read it already (false: absent).
local function open_slot(format, found)
  if not format then return end
  slot = {format = format}
  if found ~= nil then slot.last = last_token(found) end
end

-- A new fencing token: the clock in microseconds, or one more than the slot's last token when
-- the clock is behind it (it stepped back).
local function new_token()
  local _, now = clock()
  -- A lock of the library's own (the reaper's, the healing's) is in no lock prefix's slot.
  if not slot then return now end
  if slot.last == nil then slot.last = last_token(redis.call("GET", slot.format)) end
  local token = math.max(slot.last + 1, now)
  slot.last, slot.issued = token, true
  return token
end

-- The format key's value after this script: this file's format and the last token.
local function slot_value()
  return OWN_FORMAT .. string.format("%d", slot.last)
end

-- Writes the slot's last token, with this file's format.
local function close_slot()
  if not (slot and slot.issued) then return end
  redis.call("SET", slot.format, slot_value())
  slot.issued = false
end

-- Returns expires_at (nil: never), token, acquired_at and the holder; nothing for a record
-- without the numbers of its form (live_holders also checks the holder: readable_holder).
local function parse(record)
  local t, l, d, holder = string.match(record, "^(%d+)|(%d*)|(%d*)|(.*)$")
  if not holder or holder == "" then return end
  local token, lifetime = tonumber(t), tonumber(d)
  local acquired_at = (token - token % 1000) / 1000 - (tonumber(l) or 0)
  local expires_at = nil
  if lifetime then expires_at = acquired_at + lifetime end
  return expires_at, token, acquired_at, holder
end

-- Whether `holder` is one as Holder.encode writes it: "<state><lock>[+][*]" and five "|", or
-- six for a holder that keeps its call (lock_info), looked at only when five do not match, or
-- "<state><lock>![+][*]" and seven for a holder asked to stop, looked at last.
local function readable_holder(holder)
  return string.match(holder, "^[qr]%l%+?%*?|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*$") ~= nil
    or string.match(holder, "^[qr]%l%+?%*?|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*$") ~= nil
    or string.match(holder, "^[qr]%l!%+?%*?|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*$") ~= nil
end

-- A line of a lock's value: its owner, its record, the record's expiry, and whether this version
-- can read it; a line it cannot read is answered as it is, owner and record.
local function read_line(line)
  local escaped, record = string.match(line, "^([^|]*)|(.*)$")
  if not record then return line, line, nil, false end
  local expires_at, token, _, holder = parse(record)
  return unescape(escaped), record, expires_at, token ~= nil and readable_holder(holder)
end

-- Raises the error that RedisBackend reports as a lock holding what this version cannot read:
-- `found` is the owner and the record. (A key of another type fails its first command: WRONGTYPE.)
local function refuse_unreadable(key, found)
  found.key = key
  error({err = "UNREADABLE " .. cjson.encode(found)})
end

local function format_record(expires_at, token, acquired_at, holder)
  local late, lifetime = (token - token % 1000) / 1000 - acquired_at, ""
  if expires_at then lifetime = string.format("%d", expires_at - acquired_at) end
  if late == 0 then late = "" else late = string.format("%d", late) end
  return string.format("%d", token) .. "|" .. late .. "|" .. lifetime .. "|" .. holder
end

local function message_id(owner, holder)
  local id = string.match(holder, "^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)")
  if id == "" then return owner end
  return unescape(id)
end

local function flags(holder)
  return string.match(holder, "^[^|]*")
end

-- Whether a newer message may take the holder's place (replace): it is queued and replaceable.
local function replaceable(holder)
  return string.match(flags(holder), "^q%l%+") ~= nil
end

-- Whether the holder's place was handed by a line: its message is among the waiters.
local function was_handed(holder)
  local f = flags(holder)
  return string.byte(f, #f) == HANDED
end

-- `holder` marked as one whose place a line handed it.
local function mark_handed(holder)
  if was_handed(holder) then return holder end
  local f, rest = string.match(holder, "^([^|]*)(|.*)$")
  return f .. "*" .. rest
end

-- Records `owner`'s place in the lock at `key` (false: gives it up).
local function write_holder(key, owner, record)
  local lock = locks[key]
  if record and lock.records[owner] == nil then table.insert(lock.owners, owner) end
  lock.records[owner] = record
  lock.changed = true
end

-- Marks whether messages wait in the line of the lock at `key`.
local function set_waits(key, waits)
  local lock = locks[key]
  if lock.waits ~= waits then lock.waits, lock.changed = waits, true end
end

-- Remembers the first record of the lock that this version cannot read (live_holders).
local function mark_unreadable(key, owner, value)
  if not unreadable[key] then unreadable[key] = {owner = owner, value = value} end
end

-- Reads the lock at `key` (its value `value`, if the caller read it already; false: absent).
-- Drops the holders whose place lapsed (kept in `locks[key].lapsed`, owner -> record, for a
-- caller that frees a place as it was read); returns the others (owner -> record) and their count.
-- Lapse is judged by the server clock now (read only if a
-- place may lapse): after that clock stepped back, a lapsed place that no script dropped yet
-- counts again until the clock passes its expiry once more, as Redis' own key expiry does with
-- keys. A script that cannot hand a freed place to the lock's line (it has not its keys) passes
-- `keep_lapsed`: where messages wait in the line, the lapsed places stay, not counted, for a step
-- that hands them over (a release, a start, a new send), so that no waiter is forgotten.
--
-- A record this version cannot read (another version's, a hand edit) is neither dropped nor
-- counted as a holder: the lock is marked unreadable, so that no place is taken or handed
-- beside a holder that cannot be told apart from a free place (reject_unreadable), while its
-- readable holders may still give theirs up.
local function live_holders(key, keep_lapsed, value)
  if value == nil then value = redis.call("GET", key) end
  local lock = {
    owners = {}, records = {}, kept = {}, kept_until = 0, waits = false, existed = value ~= false, changed = false,
    lapsed = {},
  }
  locks[key] = lock
  local holders, count = {}, 0
  if not value then return holders, count end
  -- A lock of one line expires with that place: found, it has not lapsed (no clock read).
  local single = not string.find(value, "\n", 1, true)
  local first = true
  for line in string.gmatch(value, "[^\n]+") do
    if first and line == WAITS then
      lock.waits = true
    else
      local owner, record, expires_at, readable = read_line(line)
      if not readable or lock.records[owner] ~= nil then
        mark_unreadable(key, owner, record)
        table.insert(lock.kept, line)
      elseif expires_at and not single and expires_at <= clock() then
        if keep_lapsed and lock.waits then
          table.insert(lock.kept, line)
          if expires_at > lock.kept_until then lock.kept_until = expires_at end
        else
          lock.changed = true
          lock.lapsed[owner] = record
        end
      else
        table.insert(lock.owners, owner)
        lock.records[owner] = record
        holders[owner] = record
        count = count + 1
      end
    end
    first = false
  end
  return holders, count
end

-- Refuses a new place in a lock that holds a record this version cannot read (live_holders),
-- naming the record with the first SHOWN bytes of its value.
local SHOWN = 100
local function reject_unreadable(key)
  local found = unreadable[key]
  if found then
    refuse_unreadable(key, {field = found.owner, value = string.sub(found.value, 1, SHOWN), cut = #found.value > SHOWN})
  end
end

-- Sets `key` to `value` until `at` (ms of this server's clock). Redis drops a key once its clock
-- is past the key's expiry, and a place lapses once the clock reaches its own: the key expires a
-- millisecond before, so that a lock of one place found by a script has not lapsed. SET ... PXAT
-- needs Redis 6.2; Redis 7 and Valkey tell their version to a script, Redis 6 does not.
local function set_until(key, value, at)
  if redis.REDIS_VERSION_NUM then
    redis.call("SET", key, value, "PXAT", at - 1)
  else
    redis.call("SET", key, value)
    redis.call("PEXPIREAT", key, at - 1)
  end
end

-- Writes the lock at `key` as this script left it: its holders, and the lines it kept; without
-- any, the key goes. The key expires with its longest-lived holder (never, for one that never
-- lapses); while messages wait in its line, LINE_RETENTION ms later, so that the step that hands
-- a lapsed place on finds it. A lock that holds a record this version cannot read keeps an
-- expiry at least as late as it had: that record may be of a holder that never lapses.
local function expire_with_holders(key)
  close_slot()
  local lock = locks[key]
  if not lock.changed then return end
  lock.changed = false
  local lines, latest, lapses = {}, lock.kept_until, true
  if lock.waits then table.insert(lines, WAITS) end
  for _, owner in ipairs(lock.owners) do
    local record = lock.records[owner]
    if record then
      table.insert(lines, escape(owner) .. "|" .. record)
      local expires_at = parse(record)
      if not expires_at then lapses = false elseif expires_at > latest then latest = expires_at end
    end
  end
  for _, line in ipairs(lock.kept) do table.insert(lines, line) end
  if #lines == 0 or (#lines == 1 and lock.waits and #lock.kept == 0) then
    if lock.existed then redis.call("DEL", key) end
    lock.existed = false
    return
  end
  lock.existed = true
  local value = table.concat(lines, "\n")
  if unreadable[key] then
    local left = redis.call("PTTL", key)
    if left == -1 then lapses = false elseif left > 0 then latest = math.max(latest, clock() + left) end
  end
  if not lapses then
    redis.call("SET", key, value)
    return
  end
  if lock.waits then latest = latest + LINE_RETENTION end
  set_until(key, value, latest)
end

-- Whether new places are refused because the store lost its data and heals: `refusal`
-- is the key that exists while it heals (nil: the caller takes places for the healing
-- itself). `mark` is the key of the store's mark, which the caller saw written (nil: not
-- known to exist): gone, it went with the data since, and this script is the first to
-- tell. It writes the mark again, so that workers find the loss at their next heartbeat,
-- and refuses new places for UNHEALED_REFUSAL ms, or until a worker healed the store.
-- `found`: their values, when the caller read them already.
local function new_places_refused(refusal, mark, found)
  if not refusal then return false end
  if not found then
    if not mark then return redis.call("EXISTS", refusal) == 1 end
    -- One look at both: a refusal refuses, the mark alone is the usual answer, neither a loss.
    found = redis.call("MGET", refusal, mark)
  end
  if found[1] then return true end
  if mark and not found[2] then
    local _, now = clock()
    redis.call("SET", mark, "lost at " .. now)
    redis.call("SET", refusal, "lost at " .. now, "PX", UNHEALED_REFUSAL)
    return true
  end
  return false
end

-- Reads the lock at KEYS[1] and, in one MGET, the keys of its hash slot that the script was
-- given from KEYS[first] on: the format key, the refusal and the mark (new_places_refused; the
-- last two may be left out, or all three). Opens the slot (open_slot); returns the lock's value
-- and whether new places are refused.
local function read_for_place(keys, first)
  -- GET, not MGET, for the lock: MGET answers nothing for a key of another type (a lock of 0.1,
  -- a hand edit), which a new place would then overwrite; GET fails on it.
  local value = redis.call("GET", keys[1])
  if not keys[first] then return value, false end
  local found = redis.call("MGET", unpack(keys, first))
  open_slot(keys[first], found[1])
  local refused = false
  if keys[first + 1] then refused = new_places_refused(keys[first + 1], keys[first + 2], {found[2], found[3]}) end
  return value, refused
end

-- Takes one of the `limit` places of the lock for `owner`, or keeps the place
-- `owner` has and pushes its expiry back to at least `ttl + extend` from now. (acquire answers
-- a new place that never lapses with its token alone.)
-- Returns {1, token, expires_at or 0}, {0, message_id of each holder} when
-- the other holders fill every place or the holder's message has a place already,
-- or {-2} when the place would be new and new places are `refused` (new_places_refused).
-- `holders` and `count` are the lock's live holders (live_holders), updated here.
local function take_place(key, owner, limit, ttl, extend, holder, refused, holders, count)
  reject_unreadable(key)
  local now = clock()
  local expires_at = nil
  if ttl > 0 then expires_at = now + ttl + extend end

  local token, acquired_at
  local current = holders[owner]
  if current then
    local current_expiry, _, current_holder
    current_expiry, token, acquired_at, current_holder = parse(current)
    if current_expiry == nil or expires_at == nil then
      expires_at = nil
    else
      expires_at = math.max(current_expiry, expires_at)
    end
    -- A place its line handed keeps saying so until its message starts.
    if was_handed(current_holder) then holder = mark_handed(holder) end
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
    token = new_token()
    acquired_at = now
    count = count + 1
  end

  local record = format_record(expires_at, token, acquired_at, holder)
  write_holder(key, owner, record)
  holders[owner] = record
  return {1, token, expires_at or 0}, count
end

-- Whether a holder's place is recorded as queued: in a run lock, only a place its line handed.
local function queued(record)
  local _, _, _, holder = parse(record)
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

-- The line of the lock at `key`, its keys named after the lock's (keys.py). A script on the hot
-- path takes them so instead of as declared keys, which each cost the call: they share the
-- lock's hash tag, so they are in its hash slot on a Redis Cluster too.
local function line_of(key)
  local digest = key
  if string.sub(key, -4) == ":run" then digest = string.sub(key, 1, -5) end
  return {list = key .. ":line", waiters = digest .. ":waiting", served = digest .. ":served"}
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
  if not line or unreadable[key] or not (locks[key].waits or line.always) then return handed, count end
  while true do
    local head = redis.call("LINDEX", line.list, 0)
    if not head then
      set_waits(key, false)
      break
    end
    local entry = redis.call("HGET", line.waiters, head)
    -- A waiter that was let go (an operator freed it) or that holds a place already leaves.
    if entry and holders[head] then redis.call("HDEL", line.waiters, head) end
    local limit, holder, message = nil, nil, nil
    if entry and not holders[head] then
      limit, holder, message = parse_waiter(entry)
      if not limit then drop_waiter(key, line, head) end
    end
    if limit then
      if count >= limit then
        set_waits(key, true)
        break
      end
      local token = new_token()
      local record = format_record(nil, token, clock(), mark_handed(holder))
      write_holder(key, head, record)
      holders[head] = record
      count = count + 1
      table.insert(handed, string.format("%d", token) .. "\n" .. message)
    end
    redis.call("LPOP", line.list)
  end
  return handed, count
end

-- Hands the free places of the lock to its line, as hand_over does, for a step that takes a place
-- for a message that does not wait in line (acquire, replace, a swap without a waiter): a place
-- that lapsed while messages waited is theirs, in order, not the newcomer's. Only where the lock
-- says that messages wait: the others pay nothing. `line`: its keys (nil: named after the lock,
-- line_of). Returns NOTHING when nothing was handed.
local function hand_over_first(key, holders, count, line)
  if not locks[key].waits then return NOTHING, count end
  local handed
  handed, count = hand_over(key, line or line_of(key), holders, count)
  if #handed == 0 then return NOTHING, count end
  return handed, count
end

-- Takes a place (take_place), for a message that does not wait in line: where messages wait in
-- the lock's line, they are handed the free places first (hand_over_first). Returns take_place's
-- reply, or {that reply, the messages handed a place, the waiters dropped} when any were.
local function acquire(key, owner, limit, ttl, extend, holder, refused, value)
  if not value and limit > 0 then
    -- Nearly every send: a lock nobody holds. Written as take_place and expire_with_holders
    -- would, with none of their bookkeeping.
    if refused then return {-2} end
    local now = clock()
    local token = new_token()
    if ttl > 0 then
      local expires_at = now + ttl + extend
      set_until(key, escape(owner) .. "|" .. format_record(expires_at, token, now, holder), expires_at)
      close_slot()
      return {1, token, expires_at}
    end
    local record = escape(owner) .. "|" .. format_record(nil, token, now, holder)
    if slot then
      -- The lock and the slot's last token in one command.
      redis.call("MSET", key, record, slot.format, slot_value())
      slot.issued = false
    else
      redis.call("SET", key, record)
    end
    -- The token alone: a place that never lapses (a table reply costs more).
    return token
  end
  local holders, count = live_holders(key, false, value)
  local handed
  handed, count = hand_over_first(key, holders, count)
  local reply = take_place(key, owner, limit, ttl, extend, holder, refused, holders, count)
  expire_with_holders(key)
  if handed == NOTHING and #dropped == 0 then return reply end
  return {reply, handed, dropped}
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
local function join(key, line, id, entry, line_limit, keeps_latest)
  -- A message that waits again (a retry that met the lock) starts again as the copy handed next.
  redis.call("ZREM", line.served, id)
  set_waits(key, true)
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
-- `value`: the lock's value, read with the slot's keys (read_for_place).
local function take_or_wait(key, line, owner, limit, ttl, extend, holder, refused, mode, copy, entry, line_limit,
                            keeps_latest, value)
  local id = message_id(owner, holder)
  local holders, count = live_holders(key, false, value)
  -- A lock whose key lapsed forgot that its line waits: a step of the line's own looks at it.
  line.always = true
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
      local joined = join(key, line, id, entry, line_limit, keeps_latest)
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
-- handed a place. `value`: the lock's value, if the caller read it already (false: absent).
local function release_place(key, line, owner, stays_waiting, value)
  if value == nil then value = redis.call("GET", key) end
  -- Nearly every release: the one holder of a lock that no line waits for, and whose place no
  -- line handed (no "*" anywhere). The key goes, with no clock read and no parsing: the key
  -- expires with this place, so a place found is one that has not lapsed.
  if value and not string.find(value, "\n", 1, true) and not string.find(value, "*", 1, true) then
    local escaped = escape(owner)
    if string.sub(value, 1, #escaped + 1) == escaped .. "|" then
      redis.call("DEL", key)
      return 1, NOTHING
    end
  end
  local holders, count = live_holders(key, false, value)
  local waits = locks[key].waits
  local removed = 0
  local record = holders[owner]
  if record then
    write_holder(key, owner, false)
    holders[owner] = nil
    count, removed = count - 1, 1
    local _, _, _, held = parse(record)
    if line and not stays_waiting and (waits or was_handed(held)) then
      redis.call("HDEL", line.waiters, message_id(owner, held))
    end
  elseif line and waits and redis.call("LREM", line.list, 0, owner) > 0 then
    -- It waited without a place (a send whose answer was lost, given up): it leaves the line.
    redis.call("HDEL", line.waiters, owner)
  end
  local handed
  handed, count = hand_over(key, line, holders, count)
  expire_with_holders(key)
  return removed, handed
end

local function release(key, owner)
  return (release_place(key, nil, owner))
end

-- Renews a lease: pushes `owner`'s expiry back to `ttl` ms from now, never past `deadline`
-- (0: none) and never earlier than it was. Owner-checked. Writes the lock's changes,
-- so that a script may renew the leases of many locks, one after the other.
-- Returns the new expiry, 0 for a place that never lapses, -1 when owner holds no place.
local function renew_place(key, owner, ttl, deadline)
  local now = clock()
  local record = live_holders(key, true)[owner]
  if not record then
    expire_with_holders(key)
    return -1
  end
  local expires_at, token, acquired_at, holder = parse(record)
  if expires_at then
    local target = now + ttl
    if deadline > 0 and target > deadline then target = deadline end
    if target > expires_at then
      expires_at = target
      write_holder(key, owner, format_record(expires_at, token, acquired_at, holder))
    end
  end
  expire_with_holders(key)
  -- The second answer: who asked the holder to stop, escaped (a "!" after its lock type, and
  -- the last field); nil for a holder not asked.
  if string.match(holder, "^[qr]%l!") then return expires_at or 0, string.match(holder, "([^|]*)$") end
  return expires_at or 0, nil
end
