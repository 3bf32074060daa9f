-- Shared by the lock scripts (included after lib/queue, not run on its own).
-- Key layout of one lock, all under one {hash tag} so a cluster keeps them in one slot:
--   owner   hash, the lock's one key:
--             token    the holder's token (no field: nobody holds)
--             fence    the fencing token of the name's last acquisition
--             owner    the holder's owner name (shown by tenure inspect)
--             attempt  the id of the acquire call that took it when its token
--                      was the caller's own choice ('' otherwise, and for a
--                      hold handed over)
--             done     "token:fence" of the last release: its receipt (a
--                      resent release finds it and answers as the first did)
--             added    "call id:ms" of the last extend by an amount: its receipt
--           While held, its PEXPIRE is the lease. A release that hands the
--           lock to nobody leaves it as a marker (fence and done, no token)
--           for idle_ms, so the next acquisition's fence is the last one + 1;
--           a name with no marker (new, idle longer, a lease run out, a
--           restart without persistence) starts from the server's clock in
--           microseconds, above every fence handed out before (each took
--           more than a microsecond of this server's time). Re-entries are
--           counted by the owner's process, not here.
--   queue, waiters, wakes, names   as in lib/queue: they exist only while someone waits

-- redis-py's own key of the lock (a Lock made with interop="redis-py"), or
-- false. Each lock script sets it from the optional key after its own layout;
-- while it is set, the lock is held on both keys at once (redis-py's: the
-- holder's token, with the same expiry), so processes on redis-py's Lock
-- (`SET name token NX PX`) and on tenure exclude each other.
local mirror = false

-- Whether redis-py's key is held while tenure's owner hash is empty (every
-- caller asks only then): a process on redis-py's Lock holds. (A tenure hold
-- sets and lets go of both keys in one script, so the key never holds a
-- tenure token without the owner hash.)
local function outsider()
    return mirror and redis.call('EXISTS', mirror) == 1
end

-- The remaining lease in ms of whoever holds (tenure's owner, else a foreign
-- holder of redis-py's key: -1 when that key never expires), -2 nobody.
local function holder_ttl(owner_key)
    if redis.call('HEXISTS', owner_key, 'token') == 1 then
        return redis.call('PTTL', owner_key)
    end
    if outsider() then
        return redis.call('PTTL', mirror)
    end
    return -2  -- nobody (the hash, if there, is a release's marker)
end

-- The owner `owner` (its token, false: none), or false if redis-py's key no
-- longer holds that token: the hold was taken from under it (the key was
-- overwritten or deleted from outside), so it is lost, and tenure's side of it
-- is cleared here.
local function still_owner(owner_key, owner)
    if owner and mirror and redis.call('GET', mirror) ~= owner then
        redis.call('DEL', owner_key)
        return false
    end
    return owner
end

-- redis-py's key follows the owner's lease, if it holds `token`.
local function mirror_expire(token, ms)
    if mirror and redis.call('GET', mirror) == token then
        redis.call('PEXPIRE', mirror, ms)
    end
end

-- redis-py's key is let go with the hold of `token`.
local function mirror_release(token)
    if mirror and redis.call('GET', mirror) == token then
        redis.call('DEL', mirror)
    end
end

-- Whether a call for `token`, found holding, is that hold's own (a resend, or
-- a waiter handed the lock asking again) rather than a second owner that chose
-- the same token: the hold's attempt id is '' or `attempt`, or the call has none
-- (a random token, unique to its acquisition).
local function same_attempt(owner_key, attempt)
    if attempt == '' then
        return true
    end
    local stored = redis.call('HGET', owner_key, 'attempt')
    return (not stored) or stored == '' or stored == attempt
end

-- The fencing token of the next acquisition: the marker's (or the last
-- holder's) + 1, else the server's clock in microseconds (a name without one).
local function next_lock_fence(last)
    if last then
        return tonumber(last) + 1
    end
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Make `token` (owner name `name`, false: none known) the owner for
-- `lease_ms`, taken by acquire call `attempt` ('' none); return its fencing
-- token. `last` is the hash's fence field as read by the caller (nil: read
-- here). The hash may hold the previous owner (a handoff) or the marker a
-- release left: its fields are overwritten.
local function take(owner, token, lease_ms, name, attempt, last)
    if last == nil then
        last = redis.call('HGET', owner, 'fence')
    end
    local f = next_lock_fence(last)
    local fence = string.format('%d', f)
    if name then
        redis.call('HSET', owner, 'token', token, 'fence', fence, 'owner', name, 'attempt', attempt)
    else
        redis.call('HSET', owner, 'token', token, 'fence', fence, 'attempt', attempt)
        redis.call('HDEL', owner, 'owner')
    end
    redis.call('PEXPIRE', owner, lease_ms)
    if mirror then
        redis.call('SET', mirror, token, 'PX', lease_ms)
    end
    return f
end

-- Nobody holds the lock any more: the hash becomes the marker (its fence and
-- its last release's receipt) for idle_ms.
local function let_go(owner, idle_ms)
    redis.call('HDEL', owner, 'token', 'owner', 'attempt', 'added')
    redis.call('PEXPIRE', owner, idle_ms)
end

-- Hand the (free) lock to the first live waiter, inside this script, so no
-- newcomer can barge in, and announce it on the waiter's channel. The
-- handed-over lease is short (handoff_ms) until the new owner confirms it
-- with its full lease, so a waiter that died just before its turn delays the
-- others by at most that. `last`: the hash's fence, if the caller read it (nil: read here).
local function grant_next(owner, queue, waiters, wakes, handoff_ms, now, names, last)
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
        return false
    end
    local channel = channel_of(wakes, head)
    local name = name_of(names, head)
    leave_queue(queue, waiters, wakes, head, names)
    local f = take(owner, head, handoff_ms, name, '', last)
    announce(channel, head, f, handoff_ms, now)
    return head
end
