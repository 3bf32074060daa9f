-- Shared by the lock scripts (included, not run on its own).
-- Key layout of one lock, all under one {hash tag} so a cluster keeps them in one slot:
--   owner   hash {token, fence, count}; its PEXPIRE is the lease; count (re-entries
--           beyond the first) is absent until the owner re-enters
--   queue   zset token -> arrival time in microseconds (server clock): FIFO order
--   waiters zset token -> expiry of the waiter's own lease in ms (server clock)
--   fence   counter, never expires: the fencing token of each acquisition
--   owner .. ':wake:' .. token   list a waiter blocks on (BLPOP); derived from the
--           owner key, so it shares the hash tag and the slot.

-- The server's clock: milliseconds (a number) and microseconds (a string,
-- exact: a Lua number would print it in floating-point notation).
local function server_time()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
        t[1] .. string.format('%06d', tonumber(t[2]))
end

-- Drop waiters whose own lease ran out (a dead or vanished waiter stalls nobody).
local function purge_waiters(queue, waiters, now)
    local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', string.format('%d', now))
    for i = 1, #dead do
        redis.call('ZREM', queue, dead[i])
        redis.call('ZREM', waiters, dead[i])
    end
end

-- Make `token` the owner for `lease_ms`; return its fencing token. The hash
-- may still hold the previous owner (a handoff): its fields are overwritten.
local function take(owner, fence, token, lease_ms)
    local f = redis.call('INCR', fence)
    redis.call('HSET', owner, 'token', token, 'fence', f)
    redis.call('PEXPIRE', owner, lease_ms)
    return f
end

-- Hand the (free) lock to the first live waiter, inside this script, so no
-- newcomer can barge in; wake exactly that waiter. The handed-over lease is
-- short (handoff_ms) until the new owner confirms it with its full lease, so
-- a waiter that died just before its turn delays the others by at most that.
-- The wake-up carries "fence:handoff_ms:server time of the grant in ms".
local function grant_next(owner, queue, waiters, fence, handoff_ms, now)
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
        return false
    end
    redis.call('ZREM', queue, head)
    redis.call('ZREM', waiters, head)
    local f = take(owner, fence, head, handoff_ms)
    local wake = owner .. ':wake:' .. head
    redis.call('RPUSH', wake, f .. ':' .. handoff_ms .. ':' .. string.format('%d', now))
    redis.call('PEXPIRE', wake, handoff_ms * 2 + 1000)
    return head
end
