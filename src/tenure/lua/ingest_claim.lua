-- tenure script: ingest_claim
-- Claim the next chunk that is free or whose lease ran out.
-- on resend: a running claim already holds this token: the same chunk, fence and
--   cursor are answered (the fence kept in the leases hash as "fence:<chunk>")
-- KEYS[1] free zset chunk -> lease expiry in ms (0: never claimed, or given back)
-- KEYS[2] leases hash chunk -> token, and "fence:<chunk>" -> the claim's fencing number
-- KEYS[3] cursors hash chunk -> the last key committed
-- KEYS[4] stats hash {rows, chunks_done, claims, started}
-- KEYS[5] fence counter
-- KEYS[6] plan hash {fingerprint, plan, chunks}
-- ARGV[1] the claim's token
-- ARGV[2] lease in ms
-- ARGV[3] the fingerprint of the plan the caller works on
-- returns {1, chunk, fencing number, cursor or false, 1 if the chunk's last lease
--   ran out unreleased (taken over from a dead worker) else 0}; {-1, ms until a lease
--   runs out} when every chunk left is leased; {0} when every chunk is done;
--   {-2} when the job holds no plan or another one (it was reset meanwhile);
--   {-3} when this token's claim was given back before it arrived (its worker
--   stopped while the call was on its way: nothing is claimed)

if redis.call('HGET', KEYS[6], 'fingerprint') ~= ARGV[3] then
    return {-2}
end
if redis.call('HEXISTS', KEYS[2], 'released:' .. ARGV[1]) == 1 then
    return {-3}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, running in ipairs(redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE')) do
    if redis.call('HGET', KEYS[2], running) == ARGV[1] then -- a resent call
        return {1, tonumber(running), tonumber(redis.call('HGET', KEYS[2], 'fence:' .. running)),
            redis.call('HGET', KEYS[3], running)}
    end
end
local found = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
if #found == 0 then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    if #first == 0 then
        return {0}
    end
    return {-1, math.max(0, tonumber(first[2]) - now)}
end
local chunk = found[1]
local taken_over = tonumber(found[2]) > 0 and 1 or 0 -- 0: never claimed, or given back
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), chunk)
redis.call('HSET', KEYS[2], chunk, ARGV[1])
redis.call('HINCRBY', KEYS[4], 'claims', 1)
redis.call('HSETNX', KEYS[4], 'started', now)
local fence = redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[2], 'fence:' .. chunk, fence)
return {1, tonumber(chunk), fence, redis.call('HGET', KEYS[3], chunk), taken_over}
