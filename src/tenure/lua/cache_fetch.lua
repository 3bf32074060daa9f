-- tenure script: cache_fetch
-- Read a herd-cache entry; elect exactly one caller to load or refresh it.
-- on resend: the same token finds the mark or lease its first run granted, and is
--   granted it again (the same status); a waiter is recorded under the same token again
-- KEYS[1] entry string (see lib/cache)
-- KEYS[2] lease string
-- KEYS[3] waiters hash
-- ARGV[1] this caller's token
-- ARGV[2] lease in ms, for the caller elected to load or refresh
-- ARGV[3] channel to wake this caller on when a cold entry lands ("": do not wait)
-- ARGV[4] early factor x: a fresh entry counts as stale once now + load_ms * x >= fresh until
-- returns {status, entry or false, ms, server now in ms}:
--   1 fresh: the entry; ms = freshness left (-1: for ever)
--   2 stale (or due for early refresh), and the lease is yours: the entry; refresh it
--   3 stale, someone else refreshes: the entry; ms = their lease left
--   4 missing (or holding a value tenure did not write), and the load is yours (your
--     mark is in place): load it; ms = the lease
--   5 missing, someone else loads: wait up to ms (woken if a channel was given)

--! include cache
local entry, lease, waiters, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local lease_ms = tonumber(ARGV[2])
local now = now_ms()
local raw = redis.call('GET', entry)
local loader = mark_of(raw)
if loader and redis.call('PTTL', entry) < 0 then
    loader = nil -- a mark always expires: this is a value tenure did not write
end
local fresh_until, took
if raw and not loader then
    fresh_until, took = string.match(raw, '^h(%d+):(%d+):')
    fresh_until, took = tonumber(fresh_until), tonumber(took)
    if not fresh_until then
        raw = false -- not an entry (another writer's value): a miss, loaded over
    end
end
if raw and not loader then
    if fresh_until == 0 then
        return {1, raw, -1, now}
    end
    if now + took * tonumber(ARGV[4]) < fresh_until then
        return {1, raw, fresh_until - now, now}
    end
    local holder = redis.call('GET', lease)
    if (not holder) or holder == token then
        grant_lease(entry, lease, token, lease_ms)
        return {2, raw, lease_ms, now}
    end
    return {3, raw, redis.call('PTTL', lease), now}
end
if (not loader) or loader == token then
    redis.call('SET', entry, 'l' .. token, 'PX', lease_ms)
    return {4, false, lease_ms, now}
end
local wait_ms = math.max(redis.call('PTTL', entry), 1)
if ARGV[3] ~= '' then
    redis.call('HSET', waiters, token, ARGV[3])
    redis.call('PEXPIRE', waiters, wait_ms + lease_ms)
end
return {5, false, wait_ms, now}
