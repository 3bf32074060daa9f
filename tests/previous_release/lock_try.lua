-- tenure script: lock_try
-- The fast path of acquire: take the lock if it is free and nobody waits.
-- (lock_acquire does everything else: queueing, handoff, re-entry.)
-- KEYS[1] owner hash {token, fence, owner}, PEXPIRE = lease
-- KEYS[2] queue zset (only its existence is checked)
-- KEYS[3] fencing counter
-- KEYS[4] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] lifetime in ms of a fencing counter started now
-- ARGV[4] the caller's owner name (shown by tenure inspect)
-- ARGV[5] this acquire call's id when the token is the caller's choice, else ''
-- returns the fencing token (> 0) if taken, else 0
-- on resend: the token holds already, taken by this call (ARGV[5]); its fencing
--   token is answered again. A second owner that chose the same token is refused.

local function next_fence(fence, idle_ms)
    local f = redis.call('INCR', fence)
    if f == 1 then
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', fence, string.format('%d', f), 'PX', idle_ms)
    end
    return f
end
local mirror = false
local function outsider()
    return mirror and redis.call('EXISTS', mirror) == 1
end
local function still_owner(owner_key, owner)
    if owner and mirror and redis.call('GET', mirror) ~= owner then
        redis.call('DEL', owner_key)
        return false
    end
    return owner
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
mirror = KEYS[4] or false
local owner = still_owner(KEYS[1], redis.call('HGET', KEYS[1], 'token'))
if owner then
    if owner == ARGV[1] and same_attempt(KEYS[1], ARGV[5]) then
        return tonumber(redis.call('HGET', KEYS[1], 'fence'))
    end
    return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 or outsider() then
    return 0
end
return take(KEYS[1], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
