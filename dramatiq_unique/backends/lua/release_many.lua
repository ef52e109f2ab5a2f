-- flags: allow-oom
-- KEYS: the format key of the hash slot of the locks (open_slot), then each lock, whose line is
-- named after it (line_of). ARGV: the owner of each.
-- Returns {1 or 0 for each, as release does; the messages their lines were handed; the waiters
-- dropped (hand_over)}; or only the first when there are neither (a nested reply costs more).
local released, handed = {}, {}
open_slot(KEYS[1])
for i = 2, #KEYS do
  local removed, more = release_place(KEYS[i], line_of(KEYS[i]), ARGV[i - 1], false)
  released[i - 1] = removed
  for _, message in ipairs(more) do table.insert(handed, message) end
end
if #handed == 0 and #dropped == 0 then return released end
return {released, handed, dropped}
