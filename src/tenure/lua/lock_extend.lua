-- tenure script: lock_extend
-- Extend or reset the lease of a lock the token owns.
-- KEYS[1] owner hash (lib/lock; a Redlock master's: lib/redlock)
-- KEYS[2] optional: redis-py's key of the lock, `name` (interop="redis-py"): it
--         must hold the token too, and follows the new lease
-- ARGV[1] token
-- ARGV[2] milliseconds
-- ARGV[3] add (remaining lease + ms) | set (lease becomes ms)
-- ARGV[4] add: the call's id (a fresh random id per call); set: ''
-- ARGV[5] the fence of the hold being extended, or '' (not known, or a Redlock
--         master's): a hold of the token with another fence is not this one
-- ARGV[6] a Redlock's acquire call id when its token was chosen, or '': a hold of
--         the token by another call (owner-hash field `call`) is not this one
-- returns the new remaining lease in ms, or 0 if the token does not own the lock
-- on resend: set sets the same lease again; add finds its receipt (the hash's
--         field `added`, the hold's last add) and answers the lease it set, adding nothing

local held = redis.call('HMGET', KEYS[1], 'token', 'fence', 'call', 'added')
if held[1] ~= ARGV[1] or (ARGV[5] ~= '' and held[2] ~= ARGV[5])
    or (ARGV[6] ~= '' and held[3] ~= ARGV[6]) then
    return 0
end
if KEYS[2] and redis.call('GET', KEYS[2]) ~= ARGV[1] then
    return 0  -- redis-py's key was taken from under the hold: it is lost
end
local ms = tonumber(ARGV[2])
if ARGV[3] == 'add' then
    local id = ARGV[4] .. ':'
    if held[4] and string.sub(held[4], 1, #id) == id then
        return tonumber(string.sub(held[4], #id + 1))
    end
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then
        ms = ms + left
    end
    redis.call('HSET', KEYS[1], 'added', id .. string.format('%d', ms))
end
redis.call('PEXPIRE', KEYS[1], ms)
if KEYS[2] then
    redis.call('PEXPIRE', KEYS[2], ms)
end
return ms
