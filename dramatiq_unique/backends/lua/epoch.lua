-- The mark of this node's data: written once, so it changes only when the data is lost.
-- KEYS[1]: the mark; KEYS[2]: the refusal of new places (new_places_refused), or none.
-- ARGV: the value to write where the mark is missing. Returns the mark.
-- With a refusal key, the caller saw the mark written: gone, it went with the data, and new
-- places are refused from this step on, before a worker that heals the store refuses them too.
local mark = redis.call("GET", KEYS[1])
if not mark then
  redis.call("SET", KEYS[1], ARGV[1])
  if KEYS[2] then redis.call("SET", KEYS[2], "lost", "PX", UNHEALED_REFUSAL) end
  mark = ARGV[1]
end
return mark
