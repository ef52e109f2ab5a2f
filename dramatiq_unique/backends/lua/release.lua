-- KEYS[1]: the lock. ARGV: owner.
return release(KEYS[1], ARGV[1])
