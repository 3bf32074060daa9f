-- tenure script: semaphore_release
-- Return the caller's permit and hand free permits to the first live waiters.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] fencing counter
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] limit
-- returns 1 released, 0 the caller held no live permit (it had expired)

--! include queue
--! include semaphore
local holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = server_time()
local expiry = redis.call('ZSCORE', holders, ARGV[1])
local released = 0
if expiry then
    redis.call('ZREM', holders, ARGV[1])
    if tonumber(expiry) > now then
        released = 1
    end
end
if redis.call('EXISTS', queue) == 1 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', string.format('%d', now))
    purge_waiters(queue, waiters, now)
    grant_permits(holders, queue, waiters, fence, tonumber(ARGV[3]), ARGV[2], now)
end
return released
