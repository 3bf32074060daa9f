-- tenure script: semaphore_leave
-- A waiter gives up: leave the queue. A permit granted to it meanwhile is
-- kept (ARGV[3] = keep) or passed on (ARGV[3] = pass); free permits go to
-- the next waiters.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] fencing counter
-- KEYS[5] the caller's wake list
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] keep | pass
-- ARGV[4] limit
-- returns {1, fence, remaining lease ms} if the caller keeps a permit, {0} otherwise

--! include queue
--! include semaphore
local holders, queue, waiters, fence, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token = ARGV[1]
local now = server_time()
leave_queue(queue, waiters, token)
redis.call('ZREMRANGEBYSCORE', holders, '-inf', string.format('%d', now))
purge_waiters(queue, waiters, now)
local expiry = redis.call('ZSCORE', holders, token)
if expiry then
    if ARGV[3] == 'keep' then
        local f = fence_from_wake(wake)
        redis.call('DEL', wake)
        return {1, f, tonumber(expiry) - now}
    end
    redis.call('ZREM', holders, token)
end
redis.call('DEL', wake)
grant_permits(holders, queue, waiters, fence, tonumber(ARGV[4]), ARGV[2], now)
return {0}
