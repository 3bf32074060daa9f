-- tenure script: ingest_commit
-- Append one batch of a claimed chunk to the sink and move its cursor, atomically.
-- The same call made twice (a client library resending it after a dropped
-- connection, when the first one had run) is answered 1 and changes nothing:
-- the batch names the cursor it follows, and a finished chunk keeps its last token.
-- on resend: the batch's last key is the chunk's cursor already, or the chunk is
--   "done:<token>": answered 1, nothing appended
-- KEYS[1] free zset chunk -> lease expiry in ms
-- KEYS[2] leases hash chunk -> token; "done:<token>" once the chunk is done
-- KEYS[3] cursors hash chunk -> the last key committed
-- KEYS[4] stats hash {rows, chunks_done, claims, updated}
-- KEYS[5] the sink: a stream (XADD) or a list (RPUSH)
-- ARGV[1] the claim's token
-- ARGV[2] the chunk
-- ARGV[3] lease in ms, renewed by this commit
-- ARGV[4] 1 if this batch ends the chunk, else 0
-- ARGV[5] "stream" or "list"
-- ARGV[6] the cursor this batch follows ("" if nothing was committed in the chunk)
-- ARGV[7...] the rows: key, payload, key, payload... (keys ascending)
-- returns 1 if committed (now or by this same call before), 0 if the claim is
--   no longer this caller's; an error, appending nothing, if the batch's keys
--   are not ascending after the cursor

local chunk = ARGV[2]
local lease = redis.call('HGET', KEYS[2], chunk)
if lease == 'done:' .. ARGV[1] then
    return 1 -- this claim's final commit ran already: a resent call
end
if lease ~= ARGV[1] or redis.call('ZSCORE', KEYS[1], chunk) == false then
    return 0
end
local rows = (#ARGV - 6) / 2
local cursor = redis.call('HGET', KEYS[3], chunk) or ''
if cursor ~= ARGV[6] then
    if rows > 0 and cursor == ARGV[#ARGV - 1] then
        return 1 -- this batch is in already: a resent call
    end
    return 0
end
-- The batch must move the cursor forward: keys ascending, after the cursor (a
-- source that repeats a key would otherwise append the same rows for ever).
local previous = tonumber(cursor)
for i = 7, #ARGV, 2 do
    local key = tonumber(ARGV[i])
    if key == nil or (previous ~= nil and key <= previous) then
        return redis.error_reply('ERR tenure: ingest_commit: the key ' .. ARGV[i] ..
            ' does not follow ' .. (cursor ~= '' and cursor or 'the previous one') ..
            ': keys must be unique and ascending; nothing appended')
    end
    previous = key
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 7, #ARGV, 2 do
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
    redis.call('HSET', KEYS[2], chunk, 'done:' .. ARGV[1])
    redis.call('HINCRBY', KEYS[4], 'chunks_done', 1)
else
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), chunk)
end
return 1
