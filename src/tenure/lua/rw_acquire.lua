-- tenure script: rw_acquire
-- Hold for reading or writing if the queue allows it now; else join the FIFO
-- queue (or refresh the caller's place and waiter lease in it).
-- KEYS[1] holders zset: token ("r..." or "w...") -> lease expiry (ms, server clock)
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: token -> expiry (ms, server clock)
-- KEYS[4] fencing counter (never expires)
-- KEYS[5] the caller's wake list
-- ARGV[1] token; its first letter is the mode
-- ARGV[2] lease in ms
-- ARGV[3] waiter lease in ms; 0 = do not queue (a non-blocking attempt)
-- ARGV[4] unused (0)
-- ARGV[5] handoff lease in ms, for granting to waiters
-- returns {1, fence, lease ms} when the caller holds, or
--         {0, ms until the first hold expires (-2 none), place in queue (-1 none),
--          server time in ms}

--! include lock
--! include semaphore
--! include rw
local holders, queue, waiters, fence, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, lease = ARGV[1], tonumber(ARGV[2])
local waiter_lease = tonumber(ARGV[3])
local now, now_us = server_time()
redis.call('ZREMRANGEBYSCORE', holders, '-inf', string.format('%d', now))
purge_waiters(queue, waiters, now)
grant_rw(holders, queue, waiters, fence, ARGV[5], now)

if redis.call('ZSCORE', holders, token) then
    redis.call('ZADD', holders, string.format('%d', now + lease), token)
    keep_alive(holders, lease)
    local f = fence_from_wake(wake)
    redis.call('DEL', wake)
    return {1, f, lease}
end
if redis.call('EXISTS', queue) == 0 and admissible(holders, token) then
    local f = redis.call('INCR', fence)
    redis.call('ZADD', holders, string.format('%d', now + lease), token)
    keep_alive(holders, lease)
    redis.call('DEL', wake)
    return {1, f, lease}
end

local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
local ttl = -2
if first[2] then
    ttl = tonumber(first[2]) - now
end
if waiter_lease <= 0 then
    return {0, ttl, -1, now}
end
redis.call('ZADD', queue, 'NX', now_us, token)
redis.call('ZADD', waiters, string.format('%d', now + waiter_lease), token)
keep_alive(queue, waiter_lease * 2)
keep_alive(waiters, waiter_lease * 2)
return {0, ttl, redis.call('ZRANK', queue, token), now}
