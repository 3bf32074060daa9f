-- tenure script: cache_fetch
-- Read a herd-cache entry; elect exactly one caller to load or refresh it.
-- KEYS[1] entry hash (see lib/cache)
-- KEYS[2] waiters hash
-- ARGV[1] this caller's token
-- ARGV[2] lease in ms, for the caller elected to load or refresh
-- ARGV[3] channel to wake this caller on when a cold entry lands ("": do not wait)
-- ARGV[4] early factor x: a fresh entry counts as stale once now + d * x >= f (0: never)
-- returns {status, value or false, ms}:
--   1 fresh: the value
--   2 stale (or due for early refresh), and the lease is yours: the value; refresh it
--   3 stale, someone else refreshes: the value
--   4 missing, and the lease is yours: load it
--   5 missing, someone else loads: wait up to ms (woken if a channel was given)

--! include cache
local entry, waiters, token = KEYS[1], KEYS[2], ARGV[1]
local lease_ms = tonumber(ARGV[2])
local now = now_ms()
local e = redis.call('HMGET', entry, 'v', 'f', 'd', 'l', 'lu')
local value, fresh_until, took, holder, lease_until = e[1], tonumber(e[2]), tonumber(e[3]), e[4], tonumber(e[5])
local lease_free = (not holder) or (not lease_until) or lease_until <= now or holder == token
if value then
    if not fresh_until then
        return {1, value, 0}
    end
    local early = (took or 0) * tonumber(ARGV[4])
    if now + early < fresh_until then
        return {1, value, fresh_until - now}
    end
    if lease_free then
        grant_lease(entry, token, now, lease_ms)
        return {2, value, lease_ms}
    end
    return {3, value, lease_until - now}
end
if lease_free then
    grant_lease(entry, token, now, lease_ms)
    if redis.call('PTTL', entry) < 0 then
        redis.call('PEXPIRE', entry, lease_ms)
    end
    return {4, false, lease_ms}
end
local wait_ms = lease_until - now
if ARGV[3] ~= '' then
    redis.call('HSET', waiters, token, ARGV[3])
    redis.call('PEXPIRE', waiters, wait_ms + lease_ms)
end
return {5, false, wait_ms}
