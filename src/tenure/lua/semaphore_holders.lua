-- tenure script: semaphore_holders
-- Count the permits held now (leases that have not run out).
-- KEYS[1] holders zset: token -> permit expiry (ms, server clock)
-- returns the number of live permits

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
