-- tenure script: cache_commit
-- Store a herd-cache entry's new value, if the caller still holds its lease (the
-- refresh lease of a stale entry, or the load mark of a missing one).
-- on resend: the lease is gone (the first run ended it) but the entry holds this
--   very value and load time: answered 1, nothing written again. An explicit write
--   (no token) is written again: the same value, its freshness counted anew
-- KEYS[1] entry string (see lib/cache)
-- KEYS[2] lease string
-- KEYS[3] waiters hash
-- ARGV[1] the lease's token ("": an explicit write, stored whoever holds the lease)
-- ARGV[2] the stored value
-- ARGV[3] freshness in ms (0: fresh until deleted or evicted)
-- ARGV[4] the entry's lifetime in ms: freshness + herd_timeout (0: no expiry)
-- ARGV[5] how long the load took, ms
-- returns 1 if stored, 0 if refused (the lease ran out or passed to another caller;
--   the waiters are woken all the same, to ask again)

--! include cache
local entry, lease, waiters, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local stored = redis.call('GET', entry)
if token ~= '' and mark_of(stored) ~= token and redis.call('GET', lease) ~= token then
    if stored then
        local colon = string.find(stored, ':', 1, true)
        if colon and string.sub(stored, colon + 1) == ARGV[5] .. ':' .. ARGV[2] then
            return 1 -- this value is in place already: a resent call
        end
    end
    if not stored then
        wake_waiters(waiters)  -- the load was cut short (the entry deleted): ask again
    end
    return 0
end
local fresh_until = 0
if tonumber(ARGV[3]) > 0 then
    fresh_until = now_ms() + tonumber(ARGV[3])
end
local raw = 'h' .. string.format('%d', fresh_until) .. ':' .. ARGV[5] .. ':' .. ARGV[2]
if tonumber(ARGV[4]) > 0 then
    redis.call('SET', entry, raw, 'PX', ARGV[4])
else
    redis.call('SET', entry, raw)
end
redis.call('DEL', lease)  -- an explicit write also ends a refresh started before it
wake_waiters(waiters)
return 1
