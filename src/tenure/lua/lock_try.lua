-- tenure script: lock_try
-- The fast path of acquire: take the lock if it is free and nobody waits.
-- (A process's line, lock_line, queues its waiters; lock_confirm re-enters.)
-- KEYS[1] owner hash (lib/lock), PEXPIRE = lease
-- KEYS[2] queue zset (only its existence is checked)
-- KEYS[3] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] the caller's owner name (shown by tenure inspect)
-- ARGV[4] this acquire call's id when the token is the caller's choice, else ''
-- returns the fencing token (> 0) if taken, else 0
-- on resend: the token holds already, taken by this call (ARGV[4]); its fencing
--   token is answered again. A second owner that chose the same token is refused.

--! include queue
--! include lock
mirror = KEYS[3] or false
local held = redis.call('HMGET', KEYS[1], 'token', 'fence', 'attempt')
local owner = still_owner(KEYS[1], held[1])
if owner then
    local attempt = ARGV[4]
    if owner == ARGV[1] and (attempt == '' or (not held[3]) or held[3] == '' or held[3] == attempt) then
        return tonumber(held[2])
    end
    return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 or outsider() then
    return 0
end
-- (a token found here means still_owner cleared a hold lost to redis-py's key)
local last = (not held[1]) and held[2]
return take(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], last or false)
