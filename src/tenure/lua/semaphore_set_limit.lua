-- tenure script: semaphore_set_limit
-- Change the semaphore's stored limit (the explicit call every user's limit
-- is checked against); a larger limit lets the waiters at the head in now.
-- on resend: (pending: the lead's)
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] fencing counter
-- KEYS[6] unconfirmed grants hash
-- KEYS[7] the stored limit
-- KEYS[8] waiters' names hash: token -> owner name
-- KEYS[9] holders' names hash: token -> owner name
-- ARGV[1] the new limit
-- ARGV[2] handoff lease in ms
-- ARGV[3] idle time in ms after which the counter and the limit expire
-- returns the previous stored limit (0: none was stored)

--! include queue
--! include semaphore
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local previous = tonumber(redis.call('GET', KEYS[7]) or '0')
redis.call('SET', KEYS[7], ARGV[1], 'PX', ARGV[3])
local now = server_time()
purge_holders(holders, grants, now, owners)
purge_waiters(queue, waiters, wakes, now, names)
grant_permits(holders, queue, waiters, wakes, fence, grants, tonumber(ARGV[1]), ARGV[2], now, ARGV[3],
    names, owners)
return previous
