-- tenure script: cache_lease
-- Renew (lease_ms > 0) or give back (lease_ms = 0) a herd-cache refresh lease.
-- KEYS[1] entry hash (see lib/cache)
-- KEYS[2] waiters hash
-- ARGV[1] the lease's token
-- ARGV[2] new lease in ms from now, or 0 to give the lease back
-- returns 1 if the caller held the lease, 0 otherwise

--! include cache
local entry, waiters, token = KEYS[1], KEYS[2], ARGV[1]
if redis.call('HGET', entry, 'l') ~= token then
    return 0
end
local lease_ms = tonumber(ARGV[2])
if lease_ms > 0 then
    grant_lease(entry, token, now_ms(), lease_ms)
    return 1
end
if redis.call('HEXISTS', entry, 'v') == 1 then
    redis.call('HDEL', entry, 'l', 'lu')
else
    redis.call('DEL', entry)
end
wake_waiters(waiters)  -- one of them takes the lease over
return 1
