-- tenure script: lock_acquire
-- Take the lock if it is free and the caller is first in line; else join the
-- FIFO queue (or refresh the caller's place and waiter lease in it).
-- KEYS[1] owner hash {token, fence, owner}, PEXPIRE = lease
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] fencing counter
-- KEYS[6] waiters' names hash: token -> owner name
-- KEYS[7] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] waiter lease in ms; 0 = do not queue (a non-blocking attempt)
-- ARGV[4] 1 = the caller holds it and re-enters: only check that it does and reset
--         the lease (the count of re-entries is the owner's, not the server's);
--         0 = plain acquire
-- ARGV[5] handoff lease in ms, for granting a free lock to the first waiter
-- ARGV[6] the caller's wake-up channel (a pub/sub channel, not a key)
-- ARGV[7] lifetime in ms of a fencing counter started now
-- ARGV[8] the caller's owner name (shown by tenure inspect)
-- ARGV[9] this acquire call's id when the token is the caller's choice, else ''
-- returns {1, fence, lease ms} when the caller holds the lock, or
--         {0, owner's remaining lease ms (-2 none), 0-based place in queue (-1 none),
--          server time in ms, 1 if a foreign holder of redis-py's key holds it else 0}
-- on resend: the token holds already, taken by this call (ARGV[9]) or handed over
--         (answered as a re-entry or a confirmation), or keeps its place in line
--         (ZADD NX). A second owner that chose the same token waits as others do.

local function server_time()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
        t[1] .. string.format('%06d', tonumber(t[2]))
end
local function next_fence(fence, idle_ms)
    local f = redis.call('INCR', fence)
    if f == 1 then
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', fence, string.format('%d', f), 'PX', idle_ms)
    end
    return f
end
local function leave_queue(queue, waiters, wakes, token, names)
    redis.call('ZREM', queue, token)
    redis.call('HDEL', wakes, token)
    if names then
        redis.call('HDEL', names, token)
    end
end
local function purge_waiters(queue, waiters, wakes, now, names)
    local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', string.format('%d', now))
    if #dead == 0 then
        return
    end
    local gone = {}
    for i = 1, #dead do
        gone[dead[i]] = true
        redis.call('ZREM', waiters, dead[i])
    end
    local all = redis.call('HGETALL', wakes)
    for i = 1, #all, 2 do
        if gone[all[i + 1]] then
            leave_queue(queue, waiters, wakes, all[i], names)
        end
    end
end
local function keep_alive(key, ms)
    if redis.call('PTTL', key) < tonumber(ms) then
        redis.call('PEXPIRE', key, ms)
    end
end
local function refresh_channel(waiters, channel, now, waiter_lease)
    local expiry = redis.call('ZSCORE', waiters, channel)
    redis.call('ZADD', waiters, string.format('%d', now + waiter_lease), channel)
    keep_alive(waiters, waiter_lease * 2)
    return expiry ~= false and tonumber(expiry) > now
end
local function join_queue(queue, waiters, wakes, token, now, now_us, waiter_lease, channel, names,
                          name)
    redis.call('ZADD', queue, 'NX', now_us, token)
    refresh_channel(waiters, channel, now, waiter_lease)
    redis.call('HSET', wakes, token, channel)
    keep_alive(queue, waiter_lease * 2)
    keep_alive(wakes, waiter_lease * 2)
    if names then
        redis.call('HSET', names, token, name)
        keep_alive(names, waiter_lease * 2)
    end
    return redis.call('ZRANK', queue, token)
end
local function name_of(names, token)
    if not names then
        return false
    end
    return redis.call('HGET', names, token)
end
local function channel_of(wakes, token)
    return redis.call('HGET', wakes, token)
end
local function announce(channel, token, fence, handoff_ms, now)
    if channel then
        redis.pcall('PUBLISH', channel,
            token .. ':' .. string.format('%d', fence) .. ':' .. handoff_ms .. ':' .. string.format('%d', now))
    end
end
local mirror = false
local function outsider()
    return mirror and redis.call('EXISTS', mirror) == 1
end
local function holder_ttl(owner_key)
    local left = redis.call('PTTL', owner_key)
    if left == -2 and outsider() then
        return redis.call('PTTL', mirror)
    end
    return left
end
local function still_owner(owner_key, owner)
    if owner and mirror and redis.call('GET', mirror) ~= owner then
        redis.call('DEL', owner_key)
        return false
    end
    return owner
end
local function mirror_expire(token, ms)
    if mirror and redis.call('GET', mirror) == token then
        redis.call('PEXPIRE', mirror, ms)
    end
end
local function same_attempt(owner_key, attempt)
    if attempt == '' then
        return true
    end
    local stored = redis.call('HGET', owner_key, 'attempt')
    return (not stored) or stored == '' or stored == attempt
end
local function take(owner, fence, token, lease_ms, idle_ms, name, attempt)
    local f = next_fence(fence, idle_ms)
    if name then
        redis.call('HSET', owner, 'token', token, 'fence', string.format('%d', f), 'owner', name,
            'attempt', attempt)
    else
        redis.call('HSET', owner, 'token', token, 'fence', string.format('%d', f),
            'attempt', attempt)
        redis.call('HDEL', owner, 'owner')
    end
    redis.call('PEXPIRE', owner, lease_ms)
    if mirror then
        redis.call('SET', mirror, token, 'PX', lease_ms)
    end
    return f
end
local function grant_next(owner, queue, waiters, wakes, fence, handoff_ms, now, idle_ms, names)
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
        return false
    end
    local channel = channel_of(wakes, head)
    local name = name_of(names, head)
    leave_queue(queue, waiters, wakes, head, names)
    local f = take(owner, fence, head, handoff_ms, idle_ms, name, '')
    announce(channel, head, f, handoff_ms, now)
    return head
end
mirror = KEYS[7] or false
local owner_key, queue, waiters, wakes, fence, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, lease, channel, idle_ms, name = ARGV[1], ARGV[2], ARGV[6], ARGV[7], ARGV[8]
local attempt = ARGV[9]

-- Fast path: free and nobody waiting.
local owner = still_owner(owner_key, redis.call('HGET', owner_key, 'token'))
if ARGV[4] == '1' and owner ~= token then
    return {0, redis.call('PTTL', owner_key), -1, 0, 0}  -- a re-entry that found it gone
end
local held_outside = (not owner) and outsider()
if (not owner) and (not held_outside) and redis.call('EXISTS', queue) == 0 then
    return {1, take(owner_key, fence, token, lease, idle_ms, name, attempt), tonumber(lease)}
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
        return {1, take(owner_key, fence, token, lease, idle_ms, name, attempt), tonumber(lease)}
    end
    -- Free, but a live waiter is ahead of us (its owner's lease ran out with
    -- nobody to hand it on): give it to that waiter now, then queue behind.
    grant_next(owner_key, queue, waiters, wakes, fence, ARGV[5], now, idle_ms, names)
end

local outside = held_outside and 1 or 0
if waiter_lease <= 0 then
    return {0, holder_ttl(owner_key), -1, now, outside}
end
local place = join_queue(queue, waiters, wakes, token, now, now_us, waiter_lease, channel, names,
    name)
return {0, holder_ttl(owner_key), place, now, outside}
