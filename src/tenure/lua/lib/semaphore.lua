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

-- A read-write lock is this semaphore with no limit and a mode in each
-- token's first letter: "w" holds alone, "r" shares with other readers. A
-- semaphore's tokens are hex, so none of them is a writer.
local function is_writer(token)
    return string.sub(token, 1, 1) == 'w'
end

-- May `token` hold now, given the current holders (ignoring the queue)?
local function admissible(holders, token, limit)
    local count = redis.call('ZCARD', holders)
    if count >= limit then
        return false
    end
    if count == 0 then
        return true
    end
    if is_writer(token) then
        return false
    end
    return not is_writer(redis.call('ZRANGE', holders, 0, 0)[1])
end

-- Serve the queue in order, inside this script (FIFO: a newcomer never gets
-- in while someone waits): grant the waiters at the head for as long as they
-- are admissible. A writer waiting at the head stops the readers behind it,
-- so writers never starve. Each gets a short handoff lease until it
-- confirms, and exactly its wake list is pushed.
local function grant_permits(holders, queue, waiters, fence, limit, handoff_ms, now)
    while true do
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head or not admissible(holders, head, limit) then
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
        if is_writer(head) then
            return
        end
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
