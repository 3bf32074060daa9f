-- tenure script: semaphore_extend
-- Extend or reset the lease of the caller's permit.
-- on resend: (pending: the lead's)
-- KEYS[1] holders zset
-- KEYS[2] the stored limit (kept alive while permits are held)
-- KEYS[3] holders' names hash: token -> owner name
-- ARGV[1] token
-- ARGV[2] milliseconds
-- ARGV[3] add (remaining lease + ms) | set (lease becomes ms)
-- ARGV[4] idle time in ms after which the limit expires
-- returns the new remaining lease in ms, or 0 if the caller holds no live permit

--! include queue
local now = server_time()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
    if expiry then
        redis.call('ZREM', KEYS[1], ARGV[1])
        redis.call('HDEL', KEYS[3], ARGV[1])
    end
    return 0
end
local until_ms = now + tonumber(ARGV[2])
if ARGV[3] == 'add' then
    until_ms = tonumber(expiry) + tonumber(ARGV[2])
end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', until_ms), ARGV[1])
keep_alive(KEYS[1], until_ms - now)
keep_alive(KEYS[3], until_ms - now)
keep_alive(KEYS[2], math.max(tonumber(ARGV[4]), until_ms - now))
return until_ms - now
