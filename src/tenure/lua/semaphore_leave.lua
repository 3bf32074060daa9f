-- tenure script: semaphore_leave
-- A waiter gives up, or an acquire is undone: leave the queue. A permit
-- granted to the caller meanwhile (or taken by the call being undone) is kept
-- (ARGV[3] = keep) or passed on (ARGV[3] = pass); free permits go to the next
-- waiters.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] fencing counter
-- KEYS[6] unconfirmed grants hash
-- KEYS[7] the stored limit
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] keep | pass
-- ARGV[4] limit, if none is stored
-- ARGV[5] idle time in ms after which the counter and the limit expire
-- returns {1, fence, remaining lease ms} if the caller keeps a permit (the
--         fence is 0 if the permit was not a grant), {0} otherwise

--! include queue
--! include semaphore
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token = ARGV[1]
local now = server_time()
leave_queue(queue, waiters, wakes, token)
purge_holders(holders, grants, now)
purge_waiters(queue, waiters, wakes, now)
local expiry = redis.call('ZSCORE', holders, token)
local granted = redis.call('HGET', grants, token)
redis.call('HDEL', grants, token)
if expiry then
    if ARGV[3] == 'keep' then
        return {1, tonumber(granted or '0'), tonumber(expiry) - now}
    end
    redis.call('ZREM', holders, token)
end
local limit = tonumber(redis.call('GET', KEYS[7]) or ARGV[4])
grant_permits(holders, queue, waiters, wakes, fence, grants, limit, ARGV[2], now, ARGV[5])
return {0}
