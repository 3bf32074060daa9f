-- tenure script: lock_confirm
-- The caller's token holds the lock: set its full lease and answer its fence.
-- For an owner entering its hold again (re-entry: the count is the owner's,
-- not the server's), and for a waiter confirming the lock handed to it on
-- the short handoff lease. (lock_try takes a free lock; a process's line,
-- lock_line, queues its waiters; a release hands the lock on.)
-- KEYS[1] owner hash (lib/lock), PEXPIRE = lease
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] waiters' names hash
-- KEYS[6] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] the caller's owner name (shown by tenure inspect)
-- returns {1, fence, lease ms} when the token holds the lock, else {0}
-- on resend: the token still holds: its lease is set again, its fence answered again

--! include queue
--! include lock
mirror = KEYS[6] or false
local owner_key, queue, waiters, wakes, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, lease = ARGV[1], ARGV[2]
local held = redis.call('HMGET', owner_key, 'token', 'fence')
if still_owner(owner_key, held[1]) ~= token then
    return {0}
end
redis.call('HSET', owner_key, 'owner', ARGV[3])
redis.call('PEXPIRE', owner_key, lease)
mirror_expire(token, lease)
-- (a waiter handed the lock while its line's join of it was on its way)
leave_queue(queue, waiters, wakes, token, names)
return {1, tonumber(held[2]), tonumber(lease)}
