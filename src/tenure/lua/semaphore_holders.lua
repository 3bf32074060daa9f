-- tenure script: semaphore_holders
-- Count the permits held now (leases that have not run out).
-- read only
-- KEYS[1] holders zset: token -> permit expiry (ms, server clock)
-- returns the number of live permits

--! include queue
local now = server_time()
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
