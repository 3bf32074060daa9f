-- tenure script: ingest_status
-- A job's figures, read at one instant of the server's clock.
-- KEYS[1] plan hash {fingerprint, plan, chunks}
-- KEYS[2] free zset chunk -> lease expiry in ms (0: never claimed); done chunks leave it
-- KEYS[3] stats hash {rows, chunks_done, claims}
-- returns {chunks, chunks left, chunks whose lease is running, rows, chunks done, claims}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stats = redis.call('HMGET', KEYS[3], 'rows', 'chunks_done', 'claims')
return {
    tonumber(redis.call('HGET', KEYS[1], 'chunks') or 0),
    redis.call('ZCARD', KEYS[2]),
    redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf'),
    tonumber(stats[1] or 0),
    tonumber(stats[2] or 0),
    tonumber(stats[3] or 0),
}
