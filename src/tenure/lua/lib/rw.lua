-- Shared by the read-write lock scripts (included after lib/lock and lib/semaphore).
-- Holders and waiters are one sorted set each, as for a semaphore; a token's
-- first letter is its mode: "r" (shared) or "w" (exclusive).

local function is_writer(token)
    return string.sub(token, 1, 1) == 'w'
end

-- May `token` hold now, given the current holders (ignoring the queue)?
local function admissible(holders, token)
    local count = redis.call('ZCARD', holders)
    if count == 0 then
        return true
    end
    if is_writer(token) then
        return false
    end
    return not is_writer(redis.call('ZRANGE', holders, 0, 0)[1])
end

-- Serve the queue in order: a writer at the head when nobody holds, or every
-- reader at the head up to the next writer when no writer holds. A writer
-- that waits stops the readers behind it, so writers never starve.
local function grant_rw(holders, queue, waiters, fence, handoff_ms, now)
    while true do
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head or not admissible(holders, head) then
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
