-- tenure script: lock_try
-- The fast path of acquire: take the lock if it is free and nobody waits.
-- (lock_acquire does everything else: queueing, handoff, re-entry.)
-- KEYS[1] owner hash {token, fence, owner}, PEXPIRE = lease
-- KEYS[2] queue zset (only its existence is checked)
-- KEYS[3] fencing counter
-- KEYS[4] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] lifetime in ms of a fencing counter started now
-- ARGV[4] the caller's owner name (shown by tenure inspect)
-- ARGV[5] this acquire call's id when the token is the caller's choice, else ''
-- returns the fencing token (> 0) if taken, else 0
-- on resend: the token holds already, taken by this call (ARGV[5]); its fencing
--   token is answered again. A second owner that chose the same token is refused.

--! include queue
--! include lock
mirror = KEYS[4] or false
local owner = still_owner(KEYS[1], redis.call('HGET', KEYS[1], 'token'))
if owner then
    if owner == ARGV[1] and same_attempt(KEYS[1], ARGV[5]) then
        return tonumber(redis.call('HGET', KEYS[1], 'fence'))
    end
    return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 or outsider() then
    return 0
end
return take(KEYS[1], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
