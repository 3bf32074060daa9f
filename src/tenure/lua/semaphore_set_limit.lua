-- tenure script: semaphore_set_limit
-- Change the semaphore's stored limit (the explicit call every user's limit
-- is checked against); a larger limit lets the waiters at the head in now.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] fencing counter
-- KEYS[5] unconfirmed grants hash
-- KEYS[6] the stored limit
-- ARGV[1] the new limit
-- ARGV[2] handoff lease in ms
-- ARGV[3] the semaphore's wake-up channel (a pub/sub channel, not a key)
-- ARGV[4] idle time in ms after which the counter and the limit expire
-- returns the previous stored limit (0: none was stored)

--! include queue
--! include semaphore
local holders, queue, waiters, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local previous = tonumber(redis.call('GET', KEYS[6]) or '0')
redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[4])
local now = server_time()
purge_holders(holders, grants, now)
purge_waiters(queue, waiters, now)
grant_permits(holders, queue, waiters, fence, grants, tonumber(ARGV[1]), ARGV[2], now, ARGV[3], ARGV[4])
return previous
