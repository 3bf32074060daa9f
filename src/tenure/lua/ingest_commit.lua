-- tenure script: ingest_commit
-- Append one batch of a claimed chunk to the sink and move its cursor, atomically.
-- KEYS[1] free zset chunk -> lease expiry in ms
-- KEYS[2] leases hash chunk -> token
-- KEYS[3] cursors hash chunk -> the last key committed
-- KEYS[4] stats hash {rows, chunks_done, claims, updated}
-- KEYS[5] the sink: a stream (XADD) or a list (RPUSH)
-- ARGV[1] the claim's token
-- ARGV[2] the chunk
-- ARGV[3] lease in ms, renewed by this commit
-- ARGV[4] 1 if this batch ends the chunk, else 0
-- ARGV[5] "stream" or "list"
-- ARGV[6...] the rows: key, payload, key, payload... (keys ascending)
-- returns 1 if committed, 0 if the claim is no longer this caller's

local chunk = ARGV[2]
if redis.call('HGET', KEYS[2], chunk) ~= ARGV[1] or redis.call('ZSCORE', KEYS[1], chunk) == false then
    return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rows = (#ARGV - 5) / 2
for i = 6, #ARGV, 2 do
    if ARGV[5] == 'stream' then
        redis.call('XADD', KEYS[5], '*', 'key', ARGV[i], 'row', ARGV[i + 1])
    else
        redis.call('RPUSH', KEYS[5], ARGV[i + 1])
    end
end
if rows > 0 then
    redis.call('HSET', KEYS[3], chunk, ARGV[#ARGV - 1])
    redis.call('HINCRBY', KEYS[4], 'rows', rows)
    redis.call('HSET', KEYS[4], 'updated', now)
end
if ARGV[4] == '1' then
    redis.call('ZREM', KEYS[1], chunk)
    redis.call('HDEL', KEYS[2], chunk)
    redis.call('HINCRBY', KEYS[4], 'chunks_done', 1)
else
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), chunk)
end
return 1
