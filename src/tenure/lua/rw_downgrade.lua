-- tenure script: rw_downgrade
-- Turn the caller's write hold into a read hold without letting go, then let
-- in the readers waiting at the head of the queue.
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
-- ARGV[1] the write token ("w...")
-- ARGV[2] the read token ("r...") that replaces it
-- ARGV[3] handoff lease in ms
-- ARGV[4] limit (the read-write lock's: no limit)
-- ARGV[5] idle time in ms after which the counter and the limit expire
-- returns 1 downgraded, 0 the caller held no live write lock

--! include queue
--! include semaphore
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local now = server_time()
local expiry = redis.call('ZSCORE', holders, ARGV[1])
if not expiry or tonumber(expiry) <= now then
    return 0
end
redis.call('ZREM', holders, ARGV[1])
redis.call('ZADD', holders, expiry, ARGV[2])
redis.call('HDEL', grants, ARGV[1])
local name = redis.call('HGET', owners, ARGV[1])
redis.call('HDEL', owners, ARGV[1])
if name then
    redis.call('HSET', owners, ARGV[2], name)
end
purge_waiters(queue, waiters, wakes, now, names)
grant_permits(holders, queue, waiters, wakes, fence, grants, tonumber(ARGV[4]), ARGV[3], now, ARGV[5],
    names, owners)
return 1
