-- Shared by the cache scripts (included, not run on its own).
-- Keys of one herd-cache entry, all under one {hash tag}:
--   entry   string "h<fresh until>:<load ms>:<value>": fresh until, ms on the
--           server's clock (0: fresh for ever); how long its last load took;
--           then the stored value (tenure's header + payload). Its PEXPIRE is
--           freshness + herd_timeout. A client that knows the server's clock
--           serves a fresh value without a script. While the entry is missing
--           and one caller loads it, the key holds that caller's load mark
--           "l<token>" instead, its PEXPIRE the load lease: the client's first
--           read is SET entry l<token> NX PX lease GET, which returns a value as
--           GET would, and on a missing entry elects its caller in the same call.
--   lease   string: the token of the one caller elected to refresh a stale
--           entry; its PEXPIRE is the lease
--   waiters hash token -> the pub/sub channel of a caller waiting for a cold
--           entry to land (one message per waiter: its token)

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The token of the load mark `raw` (nil if raw is a value, or nothing).
local function mark_of(raw)
    if raw and string.sub(raw, 1, 1) == 'l' then
        return string.sub(raw, 2)
    end
    return nil
end

-- Give the refresh lease of a stale entry to `token` for lease_ms, and keep the
-- entry alive at least that long (a refresh must not lose the value it refreshes).
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
