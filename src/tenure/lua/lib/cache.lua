-- Shared by the cache scripts (included, not run on its own).
-- Keys of one herd-cache entry, all under one {hash tag}:
--   entry   string "h<fresh until>:<load ms>:<value>": fresh until, ms on the
--           server's clock (0: fresh for ever); how long its last load took;
--           then the stored value (tenure's header + payload). Its PEXPIRE is
--           freshness + herd_timeout. A plain GET reads it: a client that
--           knows the server's clock serves a fresh value without a script.
--   lease   string: the token of the one caller elected to load or refresh the
--           entry; its PEXPIRE is the lease
--   waiters hash token -> the pub/sub channel of a caller waiting for a cold
--           entry to land (one message per waiter: its token)

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Give the lease to `token` for lease_ms, and keep a stale entry alive at
-- least that long (a refresh must not lose the value it refreshes).
local function grant_lease(entry, lease, token, lease_ms)
    redis.call('SET', lease, token, 'PX', lease_ms)
    local left = redis.call('PTTL', entry)
    if left >= 0 and left < lease_ms then
        redis.call('PEXPIRE', entry, lease_ms)
    end
end

-- Wake every caller waiting for this entry (each re-reads it), and forget them.
local function wake_waiters(waiters)
    local found = redis.call('HGETALL', waiters)
    for i = 1, #found, 2 do
        redis.pcall('PUBLISH', found[i + 1], found[i])
    end
    redis.call('DEL', waiters)
end
