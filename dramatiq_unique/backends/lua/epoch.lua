-- The mark of this node's data: written once, so it changes only when the data is lost.
-- KEYS[1]: the mark. ARGV: the value to write where it is missing. Returns the mark.
local mark = redis.call("GET", KEYS[1])
if not mark then
  redis.call("SET", KEYS[1], ARGV[1])
  mark = ARGV[1]
end
return mark
