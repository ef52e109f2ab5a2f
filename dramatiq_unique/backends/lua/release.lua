-- flags: allow-oom
-- KEYS[1]: the lock; KEYS[2]: the format key of its hash slot (open_slot), or none for a lock of
-- the library's own, which has no line (line_of). ARGV: owner.
-- Returns {1, or 0 when the owner held no place; the messages its line was handed; the waiters
-- dropped (hand_over)}; or only that 1 or 0 when there are neither (a table reply costs more).
local line = nil
if KEYS[2] then
  open_slot(KEYS[2])
  line = line_of(KEYS[1])
end
local removed, handed = release_place(KEYS[1], line, ARGV[1], false)
if #handed == 0 and #dropped == 0 then return removed end
return {removed, handed, dropped}
