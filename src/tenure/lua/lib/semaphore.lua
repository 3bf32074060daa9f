-- Shared by the semaphore scripts (included after lib/lock).
-- Key layout: like a lock's, but the owner is a sorted set of holders:
--   holders  zset token -> expiry of that holder's permit in ms (server clock)
--   queue, waiters, fence, holders .. ':wake:' .. token   as for a lock

-- Keep a key alive at least `ms` more (it vanishes once every member is dead).
local function keep_alive(key, ms)
    if redis.call('PTTL', key) < tonumber(ms) then
        redis.call('PEXPIRE', key, ms)
    end
end

-- Give free permits to the first live waiters, inside this script (FIFO: a
-- newcomer never gets a permit while someone waits). Each gets a short
-- handoff lease until it confirms, and exactly its wake list is pushed.
local function grant_permits(holders, queue, waiters, fence, limit, handoff_ms, now)
    while redis.call('ZCARD', holders) < limit do
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head then
            return
        end
        redis.call('ZREM', queue, head)
        redis.call('ZREM', waiters, head)
        local f = redis.call('INCR', fence)
        redis.call('ZADD', holders, string.format('%d', now + tonumber(handoff_ms)), head)
        keep_alive(holders, handoff_ms)
        local wake = holders .. ':wake:' .. head
        redis.call('RPUSH', wake, f .. ':' .. handoff_ms .. ':' .. string.format('%d', now))
        redis.call('PEXPIRE', wake, handoff_ms * 2 + 1000)
    end
end

-- The fencing token of a grant still waiting in the caller's wake list.
local function fence_from_wake(wake)
    local items = redis.call('LRANGE', wake, 0, -1)
    for i = 1, #items do
        local fence = string.match(items[i], '^(%d+):')
        if fence then
            return tonumber(fence)
        end
    end
    return 0
end
