-- tenure script: semaphore_try
-- The fast path of acquire: take a permit if one is free and nobody waits.
-- (Also the read-write lock's: see lib/semaphore.lua.)
-- KEYS[1] holders zset: token -> permit expiry (ms, server clock)
-- KEYS[2] queue zset (only its existence is checked)
-- KEYS[3] fencing counter
-- KEYS[4] the stored limit
-- KEYS[5] holders' names hash: token -> owner name
-- KEYS[6] holders' fences hash: token -> fence
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] limit: how many permits exist (must match the stored one)
-- ARGV[4] idle time in ms after which the counter and the limit expire
-- ARGV[5] the caller's owner name (shown by tenure inspect)
-- ARGV[6] this acquire call's id when the token is the caller's choice, else ''
-- returns the permit's fencing token (> 0) if taken, 0 if not, or -(stored
--         limit) if the stored limit differs from ARGV[3]
-- on resend: the token holds a permit already, taken by this call (ARGV[6]); its
--   fence is answered again. A second owner that chose the same token is refused.

--! include queue
--! include semaphore
local now, now_us = server_time()
-- No holders key: nobody holds a permit (this token neither), nothing to purge or count.
local held = redis.call('EXISTS', KEYS[1]) == 1
local mine = held and live_fence(KEYS[1], KEYS[6], ARGV[1], now)
if mine then
    return same_permit_attempt(KEYS[6], ARGV[1], ARGV[6]) and mine or 0
end
-- The limit lives at least as long as the permit taken now.
local limit, differs = stored_limit(KEYS[4], ARGV[3], math.max(tonumber(ARGV[4]), tonumber(ARGV[2])))
if differs then
    return -limit
end
if held then
    purge_holders(KEYS[1], KEYS[6], now, KEYS[5])
end
if redis.call('EXISTS', KEYS[2]) == 1 or (held and not admissible(KEYS[1], ARGV[1], limit)) then
    return 0
end
return take_permit(KEYS[1], KEYS[6], KEYS[3], ARGV[1], ARGV[2], now, ARGV[4], KEYS[5], ARGV[5],
    ARGV[6], now_us, (not held) or nil)
