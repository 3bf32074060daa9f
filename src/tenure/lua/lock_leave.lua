-- tenure script: lock_leave
-- A waiter gives up (timed out, cancelled, or failed), or an acquire is
-- undone: leave the queue. If the lock was handed to the caller meanwhile (or
-- taken by the call being undone), keep it (ARGV[3] = keep) or pass it on
-- (ARGV[3] = pass). If the lock is free, grant it to the next waiter so a
-- departing head of the line stalls nobody.
-- KEYS[1] owner hash (lib/lock)
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] waiters' names hash
-- KEYS[6] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] keep | pass
-- ARGV[4] how long in ms the marker of a lock let go here lives (lib/lock)
-- ARGV[5] the acquire call's id when the token is the caller's choice, else '': a
--         hold its token has under another call's id is a second owner's, left alone
-- returns {1, fence, remaining lease ms} if the caller holds the lock (keep),
--         {0} otherwise
-- on resend: keep finds the lock still the caller's; pass finds it gone

--! include queue
--! include lock
mirror = KEYS[6] or false
local owner_key, queue, waiters, wakes, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token = ARGV[1]
leave_queue(queue, waiters, wakes, token, names)
local now = server_time()
purge_waiters(queue, waiters, wakes, now, names)
local owner = redis.call('HGET', owner_key, 'token')
if owner == token and not same_attempt(owner_key, ARGV[5]) then
    return {0} -- held by a second owner that chose the same token
end
if owner == token then
    if ARGV[3] == 'keep' then
        return {1, tonumber(redis.call('HGET', owner_key, 'fence')), redis.call('PTTL', owner_key)}
    end
    let_go(owner_key, ARGV[4])
    mirror_release(token)
    owner = false
end
if not owner and not outsider() then
    grant_next(owner_key, queue, waiters, wakes, ARGV[2], now, names)
end
return {0}
