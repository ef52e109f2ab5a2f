-- flags: allow-oom
-- KEYS[1]: the lock; KEYS[2], KEYS[3], KEYS[4]: its line (line_at); KEYS[5]: the format key of
-- its hash slot (open_slot). ARGV: owner.
-- Returns {1, or 0 when the owner held no place; the messages its line was handed; the waiters
-- dropped (hand_over)}; or only that 1 or 0 when there are neither (a table reply costs more).
open_slot(KEYS[5])
local removed, handed = release_place(KEYS[1], line_at(KEYS[2], KEYS[3], KEYS[4]), ARGV[1], false)
if #handed == 0 and #dropped == 0 then return removed end
return {removed, handed, dropped}
