-- Shared by the cache scripts (included, not run on its own).
-- Key layout of one herd-cache entry, both keys under one {hash tag}:
--   entry   hash {v, f, d, l, lu}; its PEXPIRE is freshness + herd_timeout
--           v   the stored value (tenure's header + payload)
--           f   fresh until, ms on the server's clock (absent: fresh for ever)
--           d   how long the last load took, ms (for early refresh)
--           l   the token of the caller that holds the refresh lease
--           lu  the lease's end, ms on the server's clock
--   waiters hash token -> the pub/sub channel of a caller waiting for a cold
--           entry to land (one message per waiter: its token)

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Give the refresh lease to `token` until now + lease_ms, keeping the entry
-- alive at least that long (a lease must not die with a stale entry).
local function grant_lease(entry, token, now, lease_ms)
    redis.call('HSET', entry, 'l', token, 'lu', string.format('%d', now + lease_ms))
    local left = redis.call('PTTL', entry)
    if left >= 0 and left < lease_ms then
        redis.call('PEXPIRE', entry, lease_ms)
    end
end

-- Wake every caller waiting for this entry (each re-reads it), and forget them.
local function wake_waiters(waiters)
    local pairs_ = redis.call('HGETALL', waiters)
    for i = 1, #pairs_, 2 do
        redis.pcall('PUBLISH', pairs_[i + 1], pairs_[i])
    end
    redis.call('DEL', waiters)
end
