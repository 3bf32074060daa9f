-- Shared by the semaphore scripts (included after lib/queue).
-- Key layout: like a lock's, but the owner is a sorted set of holders:
--   holders  zset token -> expiry of that holder's permit in ms (server clock)
--   queue, waiters, wakes, fence, names   as in lib/queue
--   owners   hash token -> the holder's owner name; it mirrors the holders zset
--            (an entry goes with its permit, the key lives as long as the zset)
--   grants   hash token -> fence of each live permit (a permit handed to a waiter
--            and not yet confirmed too: its wake-up message may have been
--            missed); a resent call finds its fence here. Beside it, field
--            token .. "\0attempt": the id of the acquire call that took it, when
--            the token was the caller's choice. It lives as long as the longest
--            permit
--   done, done_old   receipts, as in lib/receipt
--   limit    the semaphore's limit, stored by its first user and kept while it is
--            used; a caller with another limit is refused (set_limit changes it)

-- A read-write lock is this semaphore with the limit RW_LIMIT (above any
-- semaphore's) and a mode in each token's first letter: "w" holds alone, "r"
-- shares with other readers. A semaphore's tokens carry no mode: a chosen
-- "worker-1" is a permit like any other.
local RW_LIMIT = 2147483647
local function is_writer(token, limit)
    return limit == RW_LIMIT and string.sub(token, 1, 1) == 'w'
end

-- The stored limit, stored as `given` if there is none yet; kept alive for
-- idle_ms. Returns the limit in force and whether it differs from `given`.
local function stored_limit(limit_key, given, idle_ms)
    local stored = redis.call('GET', limit_key)
    if not stored then
        redis.call('SET', limit_key, given, 'PX', idle_ms)
        return tonumber(given), false
    end
    keep_alive(limit_key, idle_ms)
    return tonumber(stored), tonumber(stored) ~= tonumber(given)
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
    if is_writer(token, limit) then
        return false
    end
    return not is_writer(redis.call('ZRANGE', holders, 0, 0)[1], limit)
end

-- Take `token`'s permit away, with its owner name, its fence and its call's id.
local function drop_permit(holders, grants, owners, token)
    redis.call('ZREM', holders, token)
    redis.call('HDEL', owners, token)
    redis.call('HDEL', grants, token, token .. '\0attempt')
end

-- Whether a call for `token`, found holding a permit, is that permit's own (a
-- resend, a waiter granted it asking again) rather than a second owner that
-- chose the same token: the permit's call id is none or `attempt`, or the call
-- has none (a random token, unique to its acquisition).
local function same_permit_attempt(grants, token, attempt)
    if attempt == '' then
        return true
    end
    local stored = redis.call('HGET', grants, token .. '\0attempt')
    return (not stored) or stored == attempt
end

-- Drop the permits whose lease ran out, with their names and fences.
local function purge_holders(holders, grants, now, owners)
    local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', string.format('%d', now))
    for i = 1, #expired do
        drop_permit(holders, grants, owners, expired[i])
    end
end

-- Keep `key` at least `ms` more; `alone`: nothing else in it is alive (set, no PTTL).
local function live_for(key, ms, alone)
    if alone then
        redis.call('PEXPIRE', key, ms)
    else
        keep_alive(key, ms)
    end
end

-- Note `token`'s owner name (false: none known) for a permit held `lease_ms`
-- more, and keep its fence as long. `alone`: the only live permit (as below).
local function name_permit(owners, grants, token, name, lease_ms, alone)
    if name then
        redis.call('HSET', owners, token, name)
        live_for(owners, lease_ms, alone)
    else
        redis.call('HDEL', owners, token)
    end
    live_for(grants, lease_ms, alone)
end

-- Give `token` (owner name `name`) a permit until now + lease_ms, taken by
-- acquire call `attempt` ('' or nil: none); return its fencing token (kept in grants).
-- `now_us`: the server's clock in microseconds as this script read it (nil: none).
-- With no holder before it, nothing else in holders, grants or owners is alive
-- (their entries go with their permits, the expired ones purged first): the
-- three keys live for this permit's lease, set without asking what is left.
-- `alone`: true when the caller found holders empty just before (nil: looked up here).
local function take_permit(holders, grants, fence, token, lease_ms, now, idle_ms, owners, name,
                           attempt, now_us, alone)
    local f = next_fence(fence, idle_ms, now_us)
    if alone == nil then
        alone = redis.call('EXISTS', holders) == 0
    end
    redis.call('ZADD', holders, string.format('%d', now + tonumber(lease_ms)), token)
    live_for(holders, lease_ms, alone)
    if attempt and attempt ~= '' then
        redis.call('HSET', grants, token, string.format('%d', f), token .. '\0attempt', attempt)
    else
        redis.call('HSET', grants, token, string.format('%d', f))
    end
    name_permit(owners, grants, token, name, lease_ms, alone)
    return f
end

-- The fence of `token`'s live permit, or false if it holds none now.
local function live_fence(holders, grants, token, now)
    local expiry = redis.call('ZSCORE', holders, token)
    if expiry and tonumber(expiry) > now then
        return tonumber(redis.call('HGET', grants, token) or '0')
    end
    return false
end

-- Serve the queue in order, inside this script (FIFO: a newcomer never gets
-- in while someone waits): grant the waiters at the head for as long as they
-- are admissible. A writer waiting at the head stops the readers behind it,
-- so writers never starve. Each gets a short handoff lease until it
-- confirms; its grant is recorded and announced on its process's channel.
local function grant_permits(holders, queue, waiters, wakes, fence, grants, limit, handoff_ms, now,
                             idle_ms, names, owners)
    while true do
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head or not admissible(holders, head, limit) then
            return
        end
        local channel = channel_of(wakes, head)
        local name = name_of(names, head)
        leave_queue(queue, waiters, wakes, head, names)
        local f = take_permit(holders, grants, fence, head, handoff_ms, now, idle_ms, owners, name)
        announce(channel, head, f, handoff_ms, now)
        if is_writer(head, limit) then
            return
        end
    end
end
