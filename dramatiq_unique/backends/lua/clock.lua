-- Returns now in milliseconds of the server's clock.
local now = clock()
return now
