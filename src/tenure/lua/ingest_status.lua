-- tenure script: ingest_status
-- A job's figures and the holders of its running claims, read at one instant of
-- the server's clock.
-- read only
-- KEYS[1] plan hash {fingerprint, plan, chunks}
-- KEYS[2] free zset chunk -> lease expiry in ms (0: free); done chunks leave it
-- KEYS[3] stats hash {rows, chunks_done, claims, started, updated}
-- KEYS[4] leases hash chunk -> the claim's token ("<random>@<worker>")
-- KEYS[5] cursors hash chunk -> the last key committed
-- ARGV[1] how many holders to list at most
-- returns {chunks, chunks left, chunks whose lease is running, rows, chunks done, claims,
--          started ms, last commit ms, now ms,
--          {chunk, token, ms left on the lease, cursor or false}...}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stats = redis.call('HMGET', KEYS[3], 'rows', 'chunks_done', 'claims', 'started', 'updated')
local running = redis.call('ZRANGE', KEYS[2], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0,
    tonumber(ARGV[1]), 'WITHSCORES')
local holders = {}
for i = 1, #running, 2 do
    local chunk = running[i]
    holders[#holders + 1] = {
        tonumber(chunk),
        redis.call('HGET', KEYS[4], chunk),
        tonumber(running[i + 1]) - now,
        redis.call('HGET', KEYS[5], chunk),
    }
end
return {
    tonumber(redis.call('HGET', KEYS[1], 'chunks') or 0),
    redis.call('ZCARD', KEYS[2]),
    redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf'),
    tonumber(stats[1] or 0),
    tonumber(stats[2] or 0),
    tonumber(stats[3] or 0),
    tonumber(stats[4] or 0),
    tonumber(stats[5] or 0),
    now,
    holders,
}
