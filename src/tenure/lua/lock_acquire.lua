-- tenure script: lock_acquire
-- Take the lock if it is free and the caller is first in line; else join the
-- FIFO queue (or refresh the caller's place and waiter lease in it).
-- KEYS[1] owner hash (lib/lock), PEXPIRE = lease
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] waiters' names hash: token -> owner name
-- KEYS[6] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] waiter lease in ms; 0 = do not queue (a non-blocking attempt)
-- ARGV[4] 1 = the caller holds it and re-enters: only check that it does and reset
--         the lease (the count of re-entries is the owner's, not the server's);
--         0 = plain acquire
-- ARGV[5] handoff lease in ms, for granting a free lock to the first waiter
-- ARGV[6] the caller's wake-up channel (a pub/sub channel, not a key)
-- ARGV[7] unused ('')
-- ARGV[8] the caller's owner name (shown by tenure inspect)
-- ARGV[9] this acquire call's id when the token is the caller's choice, else ''
-- returns {1, fence, lease ms} when the caller holds the lock, or
--         {0, owner's remaining lease ms (-2 none), 0-based place in queue (-1 none),
--          server time in ms, 1 if a foreign holder of redis-py's key holds it else 0}
-- on resend: the token holds already, taken by this call (ARGV[9]) or handed over
--         (answered as a re-entry or a confirmation), or keeps its place in line
--         (ZADD NX). A second owner that chose the same token waits as others do.

--! include queue
--! include lock
mirror = KEYS[6] or false
local owner_key, queue, waiters, wakes, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, lease, channel, name = ARGV[1], ARGV[2], ARGV[6], ARGV[8]
local attempt = ARGV[9]

-- Fast path: free and nobody waiting.
local owner = still_owner(owner_key, redis.call('HGET', owner_key, 'token'))
if ARGV[4] == '1' and owner ~= token then
    return {0, holder_ttl(owner_key), -1, 0, 0}  -- a re-entry that found it gone
end
local held_outside = (not owner) and outsider()
if (not owner) and (not held_outside) and redis.call('EXISTS', queue) == 0 then
    return {1, take(owner_key, token, lease, name, attempt), tonumber(lease)}
end

local waiter_lease = tonumber(ARGV[3])
local now, now_us = server_time()
purge_waiters(queue, waiters, wakes, now, names)
if owner == token and (ARGV[4] == '1' or same_attempt(owner_key, attempt)) then
    -- Already ours: a re-entry, a waiter that was handed the lock confirming
    -- it, or this same call resent.
    redis.call('HSET', owner_key, 'owner', name)
    redis.call('PEXPIRE', owner_key, lease)
    mirror_expire(token, lease)
    leave_queue(queue, waiters, wakes, token, names)
    return {1, tonumber(redis.call('HGET', owner_key, 'fence')), tonumber(lease)}
end

if not owner and not held_outside then
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if (not head) or head == token then
        leave_queue(queue, waiters, wakes, token, names)
        return {1, take(owner_key, token, lease, name, attempt), tonumber(lease)}
    end
    -- Free, but a live waiter is ahead of us (its owner's lease ran out with
    -- nobody to hand it on): give it to that waiter now, then queue behind.
    grant_next(owner_key, queue, waiters, wakes, ARGV[5], now, names)
end

local outside = held_outside and 1 or 0
if waiter_lease <= 0 then
    return {0, holder_ttl(owner_key), -1, now, outside}
end
local place = join_queue(queue, waiters, wakes, token, now, now_us, waiter_lease, channel, names,
    name)
return {0, holder_ttl(owner_key), place, now, outside}
