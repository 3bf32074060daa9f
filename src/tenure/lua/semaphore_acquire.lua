-- tenure script: semaphore_acquire
-- Take a permit if one is free and nobody is ahead of the caller; else join
-- the FIFO queue (or refresh the caller's place and waiter lease in it).
-- KEYS[1] holders zset: token -> permit expiry (ms, server clock)
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] fencing counter
-- KEYS[6] holders' fences hash: token -> fence
-- KEYS[7] the stored limit
-- KEYS[8] waiters' names hash: token -> owner name
-- KEYS[9] holders' names hash: token -> owner name
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] waiter lease in ms; 0 = do not queue (a non-blocking attempt)
-- ARGV[4] limit: how many permits exist (must match the stored one)
-- ARGV[5] handoff lease in ms, for granting free permits to waiters
-- ARGV[6] the caller's wake-up channel (a pub/sub channel, not a key)
-- ARGV[7] idle time in ms after which the counter and the limit expire
-- ARGV[8] the caller's owner name (shown by tenure inspect)
-- ARGV[9] this acquire call's id when the token is the caller's choice, else ''
-- returns {1, fence, lease ms} when the caller holds a permit,
--         {0, ms until the first permit expires (-2 none), 0-based place in queue
--          (-1 none), server time in ms}, or
--         {2, stored limit} if the stored limit differs from ARGV[4]
-- on resend: the token holds its permit already, taken by this call (ARGV[9]) or
--         granted (answered as a confirmation, with the same fence), or keeps its
--         place in line (ZADD NX). A second owner that chose the same token is
--         answered as not holding, not queued: it asks again.

--! include queue
--! include semaphore
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local token, lease = ARGV[1], tonumber(ARGV[2])
local waiter_lease = tonumber(ARGV[3])
local channel, idle_ms, name, attempt = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
-- The limit lives at least as long as a permit taken now.
local limit, differs = stored_limit(KEYS[7], ARGV[4], math.max(tonumber(idle_ms), lease))
if differs then
    return {2, limit}
end
local now, now_us = server_time()
purge_holders(holders, grants, now, owners)
purge_waiters(queue, waiters, wakes, now, names)
grant_permits(holders, queue, waiters, wakes, fence, grants, limit, ARGV[5], now, idle_ms,
    names, owners)

local held = redis.call('ZSCORE', holders, token)
if held and not same_permit_attempt(grants, token, attempt) then
    -- Held by a second owner that chose the same token: not this call's.
    return {0, tonumber(held) - now, -1, now}
end
if held then
    -- Granted while we waited (or just now): confirm the full lease.
    redis.call('ZADD', holders, string.format('%d', now + lease), token)
    keep_alive(holders, lease)
    name_permit(owners, grants, token, name, lease)
    local f = tonumber(redis.call('HGET', grants, token) or '0')
    leave_queue(queue, waiters, wakes, token, names)
    return {1, f, lease}
end
if redis.call('EXISTS', queue) == 0 and admissible(holders, token, limit) then
    local f = take_permit(holders, grants, fence, token, lease, now, idle_ms, owners, name, attempt,
        now_us)
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
return {0, ttl, join_queue(queue, waiters, wakes, token, now, now_us, waiter_lease, channel,
    names, name), now}
