-- tenure script: rw_release
-- End the caller's read or write hold and serve the queue.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] fencing counter
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- returns 1 released, 0 the caller held nothing live (its lease had run out)

--! include lock
--! include semaphore
--! include rw
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
    grant_rw(holders, queue, waiters, fence, ARGV[2], now)
end
return released
