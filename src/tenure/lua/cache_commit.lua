-- tenure script: cache_commit
-- Store a herd-cache entry's new value, if the caller still holds the lease.
-- KEYS[1] entry hash (see lib/cache)
-- KEYS[2] waiters hash
-- ARGV[1] the lease's token ("": an explicit write, stored whoever holds the lease)
-- ARGV[2] the stored value
-- ARGV[3] freshness in ms (0: fresh until deleted or evicted)
-- ARGV[4] the entry's lifetime in ms: freshness + herd_timeout (0: no expiry)
-- ARGV[5] how long the load took, ms
-- returns 1 if stored, 0 if refused (the lease ran out or passed to another caller)

--! include cache
local entry, waiters, token = KEYS[1], KEYS[2], ARGV[1]
if token ~= '' and redis.call('HGET', entry, 'l') ~= token then
    return 0
end
local now = now_ms()
redis.call('DEL', entry)
redis.call('HSET', entry, 'v', ARGV[2], 'd', ARGV[5])
if tonumber(ARGV[3]) > 0 then
    redis.call('HSET', entry, 'f', string.format('%d', now + tonumber(ARGV[3])))
end
if tonumber(ARGV[4]) > 0 then
    redis.call('PEXPIRE', entry, ARGV[4])
end
wake_waiters(waiters)
return 1
