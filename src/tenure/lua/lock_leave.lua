-- tenure script: lock_leave
-- An acquire is undone (cancelled, interrupted, failed, or answered past its
-- deadline): leave the queue, and pass on the lock if it was handed to the
-- caller meanwhile (or taken by the call being undone). If the lock is free,
-- grant it to the next waiter so a departing head of the line stalls nobody.
-- (Waiters giving up at their deadline leave through their line, lock_line.)
-- KEYS[1] owner hash (lib/lock)
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] waiters' names hash
-- KEYS[6] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] how long in ms the marker of a lock let go here lives (lib/lock)
-- ARGV[4] the acquire call's id when the token is the caller's choice, else '': a
--         hold its token has under another call's id is a second owner's, left alone
-- returns {0}
-- on resend: the caller's hold is gone (passed on, or never taken): nothing more changes

--! include queue
--! include lock
mirror = KEYS[6] or false
local owner_key, queue, waiters, wakes, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token = ARGV[1]
leave_queue(queue, waiters, wakes, token, names)
local now = server_time()
purge_waiters(queue, waiters, wakes, now, names)
local owner = redis.call('HGET', owner_key, 'token')
if owner == token and not same_attempt(owner_key, ARGV[4]) then
    return {0} -- held by a second owner that chose the same token
end
if owner == token then
    let_go(owner_key, ARGV[3])
    mirror_release(token)
    owner = false
end
if not owner and not outsider() then
    grant_next(owner_key, queue, waiters, wakes, ARGV[2], now, names)
end
return {0}
