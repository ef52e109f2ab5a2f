-- flags: allow-oom
-- KEYS: the format key of the hash slot of the locks (open_slot), then each lock followed by
-- its line (line_at): four keys a place. ARGV: the owner of each.
-- Returns {1 or 0 for each, as release does; the messages their lines were handed; the waiters
-- dropped (hand_over)}.
local released, handed = {}, {}
open_slot(KEYS[1])
for i = 2, #KEYS, 4 do
  local removed, more = release_place(KEYS[i], line_at(KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]), ARGV[(i + 2) / 4], false)
  table.insert(released, removed)
  for _, message in ipairs(more) do table.insert(handed, message) end
end
return {released, handed, dropped}
