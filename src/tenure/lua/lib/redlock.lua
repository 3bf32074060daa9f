-- Shared by the Redlock scripts (included after lib/queue, not run on its own).
-- Each master keeps its own copy of one lock's keys (owner, queue, waiters,
-- wakes and fence, as in lib/queue and lib/lock); nothing is shared between
-- masters but the caller's token and ticket.

-- The next fencing token of this master. The counter's lifetime is renewed on
-- each use (it may have been raised to another master's figure, so it must
-- not restart from this master's clock while that figure is recent); a
-- counter that is gone (idle for its lifetime, or a restart without
-- persistence) starts again from the server's clock in microseconds.
local function next_redlock_fence(fence, lifetime_ms)
    local f = redis.call('INCR', fence)
    if f == 1 then
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', fence, string.format('%d', f))
    end
    redis.call('PEXPIRE', fence, lifetime_ms)
    return f
end

-- Tell the first live waiter in line to try again now (the lock is free
-- here): the message is "token:0:0:0", a wake-up that carries no grant.
local function wake_first(queue, waiters, wakes)
    local now = server_time()
    purge_waiters(queue, waiters, wakes, now)
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head then
        local channel = channel_of(wakes, head)
        if channel then
            redis.pcall('PUBLISH', channel, head .. ':0:0:0')
        end
    end
end

-- The receipt id of attempt `mark` of `token` (by acquire call `call` when the
-- token was the caller's choice: two owners that chose it never share one).
local function attempt_id(token, call, mark)
    if call == '' then
        return token .. '/' .. mark
    end
    return token .. '/' .. call .. ':' .. mark
end
