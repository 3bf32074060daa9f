-- tenure script: cache_lease
-- Renew (lease_ms > 0) or give back (lease_ms = 0) a herd-cache lease.
-- on resend: a renewal finds its token holding the lease and sets it again; a
--   give-back finds the lease gone and answers 0, changing nothing (its caller ignores
--   the answer)
-- KEYS[1] entry string (see lib/cache)
-- KEYS[2] lease string
-- KEYS[3] waiters hash
-- ARGV[1] the lease's token
-- ARGV[2] new lease in ms from now, or 0 to give the lease back
-- returns 1 if the caller held the lease, 0 otherwise

--! include cache
local entry, lease, waiters, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
if redis.call('GET', lease) ~= token then
    return 0
end
local lease_ms = tonumber(ARGV[2])
if lease_ms > 0 then
    grant_lease(entry, lease, token, lease_ms)
    return 1
end
redis.call('DEL', lease)
wake_waiters(waiters)  -- one of them takes the load over
return 1
