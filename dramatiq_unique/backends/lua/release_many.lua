-- flags: allow-oom
-- KEYS: each lock followed by its line (line_at): four keys a place, then the fence and the
-- format of their hash slot (open_slot). ARGV: the owner of each.
-- Returns {1 or 0 for each, as release does; the messages their lines were handed; the waiters
-- dropped (hand_over)}.
local released, handed = {}, {}
open_slot(KEYS[#KEYS - 1], KEYS[#KEYS])
for i = 1, #KEYS - 2, 4 do
  local removed, more = release_place(KEYS[i], line_at(KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]), ARGV[(i + 3) / 4], false)
  table.insert(released, removed)
  for _, message in ipairs(more) do table.insert(handed, message) end
end
return {released, handed, dropped}
