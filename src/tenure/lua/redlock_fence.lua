-- tenure script: redlock_fence
-- Raise this master's fencing counter to the fence a Redlock holder was given
-- (the largest of its quorum's), if the token still holds the lock here; so a
-- later holder whose quorum shares this master gets a larger fence.
-- KEYS[1] owner hash {token, fence}
-- KEYS[2] fencing counter
-- ARGV[1] token
-- ARGV[2] the holder's fence
-- ARGV[3] lifetime in ms of the fencing counter
-- returns 1 if the token holds the lock here (the counter is now at least the fence), 0 otherwise
-- on resend: the counter is at the fence already; only its lifetime is renewed

if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
    return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
    redis.call('HSET', KEYS[1], 'fence', ARGV[2])
else
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
