-- tenure script: cache_lease
-- Renew (lease_ms > 0) or give back (lease_ms = 0) a herd-cache lease: the load
-- mark of a missing entry, or the refresh lease of a stale one.
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
local lease_ms = tonumber(ARGV[2])
if mark_of(redis.call('GET', entry)) == token then
    if lease_ms > 0 then
        redis.call('PEXPIRE', entry, lease_ms)
        return 1
    end
    redis.call('DEL', entry)
elseif redis.call('GET', lease) == token then
    if lease_ms > 0 then
        grant_lease(entry, lease, token, lease_ms)
        return 1
    end
    redis.call('DEL', lease)
else
    return 0
end
wake_waiters(waiters)  -- one of them takes the load over
return 1
