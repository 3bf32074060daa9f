-- tenure script: lock_try
-- The fast path of acquire: take the lock if it is free and nobody waits.
-- (lock_acquire does everything else: queueing, handoff, re-entry.)
-- KEYS[1] owner hash {token, fence, count}, PEXPIRE = lease
-- KEYS[2] queue zset (only its existence is checked)
-- KEYS[3] fencing counter (never expires)
-- ARGV[1] token
-- ARGV[2] lease in ms
-- returns the fencing token (> 0) if taken, else 0

if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
    return 0
end
local fence = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
