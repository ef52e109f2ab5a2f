-- KEYS: the locks. ARGV: the owner of each. Returns 1 or 0 for each, as release does.
local released = {}
for i, key in ipairs(KEYS) do
  released[i] = release(key, ARGV[i])
end
return released
