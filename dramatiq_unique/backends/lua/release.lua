-- flags: allow-oom
-- KEYS[1]: the lock; KEYS[2], KEYS[3], KEYS[4]: its line (line_at); KEYS[5], KEYS[6]: the fence
-- and the format of its hash slot (open_slot). ARGV: owner.
-- Returns {1, or 0 when the owner held no place; the messages its line was handed; the waiters
-- dropped (hand_over)}.
open_slot(KEYS[5], KEYS[6])
local removed, handed = release_place(KEYS[1], line_at(KEYS[2], KEYS[3], KEYS[4]), ARGV[1], false)
return {removed, handed, dropped}
