-- Shared by every queued primitive (included, not run on its own): the
-- server's clock, the FIFO queue of waiters and their leases, the fencing
-- counter, and the wake-up message a grant publishes.
--   queue   zset token -> arrival time in microseconds (server clock): FIFO order
--   waiters zset channel -> expiry in ms (server clock) of the waiter lease of the
--           process listening on that channel: its waiters are alive while it
--           refreshes it (one call per process, however many of its tasks or
--           threads wait), and are dropped together when it stops
--   wakes   hash token -> the pub/sub channel of the waiter's process, where its
--           grant is announced (one process hears it, not every waiting one)
--   names   hash token -> the waiter's owner name (host:pid or the caller's own),
--           kept and dropped with its channel; a grant moves it to the hold.
--           Optional (nil): a Redlock's waiters keep no names
--   fence   counter: the fencing token of each acquisition; it lives idle_ms from
--           its start and then starts again from the server's clock in
--           microseconds, so tokens only grow for a name

-- The server's clock: milliseconds (a number) and microseconds (a string,
-- exact: a Lua number would print it in floating-point notation).
local function server_time()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
        t[1] .. string.format('%06d', tonumber(t[2]))
end

-- The next fencing token of a primitive. A counter that is gone (its idle
-- expiry, or a restart without persistence) starts again from the server's
-- clock in microseconds, with a lifetime of idle_ms: above every token handed
-- out before, since each of those took more than a microsecond of this
-- server's time. (So the counter's expiry needs no refresh on each use: a
-- counter that expires while in use starts again higher.) `now_us`: that
-- clock as server_time read it in this script (nil: read here).
local function next_fence(fence, idle_ms, now_us)
    local f = redis.call('INCR', fence)
    if f == 1 then
        if now_us then
            f = tonumber(now_us)
        else
            local t = redis.call('TIME')
            f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        end
        redis.call('SET', fence, string.format('%d', f), 'PX', idle_ms)
    end
    return f
end

-- Take `token` out of the queue and forget its channel and name (its
-- process's waiter lease stays: other waiters of that process may wait on).
local function leave_queue(queue, waiters, wakes, token, names)
    redis.call('ZREM', queue, token)
    redis.call('HDEL', wakes, token)
    if names then
        redis.call('HDEL', names, token)
    end
end

-- Drop the waiters of every process whose waiter lease ran out (a dead,
-- stopped or cut-off process stalls nobody). Cheap when none did; the
-- waiters of a dead process are found in one pass over `wakes`.
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

-- Keep a key alive at least `ms` more (it vanishes once every member is dead).
local function keep_alive(key, ms)
    if redis.call('PTTL', key) < tonumber(ms) then
        redis.call('PEXPIRE', key, ms)
    end
end

-- Refresh the waiter lease of the process listening on `channel`; returns
-- whether it was still alive (false: its waiters were dropped, or none yet).
local function refresh_channel(waiters, channel, now, waiter_lease)
    local expiry = redis.call('ZSCORE', waiters, channel)
    redis.call('ZADD', waiters, string.format('%d', now + waiter_lease), channel)
    keep_alive(waiters, waiter_lease * 2)
    return expiry ~= false and tonumber(expiry) > now
end

-- Join the queue (keeping one's place if already in it), refresh one's waiter
-- lease and note the channel of one's process (passed in ARGV: a channel is
-- not a key) and one's owner name; return one's 0-based place in line.
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

-- A waiter as a line script names it: its token, or "token\0call id" for a
-- token of the caller's choosing (tokens hold no NUL): returns the token and
-- the id of its acquire call ('' for a token of tenure's own).
local function line_entry(entry)
    local at = string.find(entry, '\0', 1, true)
    if not at then
        return entry, ''
    end
    return string.sub(entry, 1, at - 1), string.sub(entry, at + 1)
end

-- Join a batch of one process's waiters, in one command per key: ARGV pairs
-- (line_entry, owner name) from ARGV[first], `count` of them, arrive in their
-- order (now + i microseconds); one already in line keeps its place (NX). A
-- token for which `skip(token, call id)` is true (it holds already, or may not
-- queue now) does not join.
local function join_batch(queue, wakes, names, channel, now_us, first, count, skip)
    local arrivals, channels, who = {}, {}, {}
    local base = tonumber(now_us)
    for i = 0, count - 1 do
        local token, attempt = line_entry(ARGV[first + 2 * i])
        local name = ARGV[first + 1 + 2 * i]
        if not skip(token, attempt) then
            arrivals[#arrivals + 1] = string.format('%d', base + i)
            arrivals[#arrivals + 1] = token
            channels[#channels + 1] = token
            channels[#channels + 1] = channel
            who[#who + 1] = token
            who[#who + 1] = name
        end
    end
    if #arrivals > 0 then
        redis.call('ZADD', queue, 'NX', unpack(arrivals))
        redis.call('HSET', wakes, unpack(channels))
        redis.call('HSET', names, unpack(who))
    end
end

-- The owner name waiter `token` gave when it queued (false if none).
local function name_of(names, token)
    if not names then
        return false
    end
    return redis.call('HGET', names, token)
end

-- The channel of waiter `token`'s process (false if it never said).
local function channel_of(wakes, token)
    return redis.call('HGET', wakes, token)
end

-- Tell the waiter `token` that it was granted `fence` on a handoff lease, on
-- its process's channel: "token:fence:handoff_ms:server time of the grant in
-- ms". That process hands it to the waiting thread or task; a message nobody
-- hears costs the waiter its next re-check. pcall: a user whose ACL forbids
-- the channel still gets the lock, by re-checks.
local function announce(channel, token, fence, handoff_ms, now)
    if channel then
        redis.pcall('PUBLISH', channel,
            token .. ':' .. string.format('%d', fence) .. ':' .. handoff_ms .. ':' .. string.format('%d', now))
    end
end
