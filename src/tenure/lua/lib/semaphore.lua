-- Shared by the semaphore scripts (included after lib/queue).
-- Key layout: like a lock's, but the owner is a sorted set of holders:
--   holders  zset token -> expiry of that holder's permit in ms (server clock)
--   queue, waiters, fence, holders .. ':wake:' .. token   as for a lock

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

-- Give `token` a permit until now + lease_ms; return its fencing token.
local function take_permit(holders, fence, token, lease_ms, now)
    local f = redis.call('INCR', fence)
    redis.call('ZADD', holders, string.format('%d', now + tonumber(lease_ms)), token)
    keep_alive(holders, lease_ms)
    return f
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
        leave_queue(queue, waiters, head)
        local f = take_permit(holders, fence, head, handoff_ms, now)
        wake_waiter(holders .. ':wake:' .. head, f, handoff_ms, now)
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
