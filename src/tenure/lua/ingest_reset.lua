-- tenure script: ingest_reset
-- Remove a job: its plan, chunks, cursors, claims, counters and fencing counter, and
-- its sink when asked. Refused while claims are running, unless forced.
-- The same call made twice (a client library resending it after a dropped connection,
-- when the first one had run) is answered as the first was and deletes nothing more,
-- not even a job planned anew in between: a marker holding the operation's id and its
-- figures stays for ARGV[4] ms.
-- on resend: the marker holds this operation's id: the first run's figures are
--   answered, nothing deleted
-- KEYS[1] plan hash
-- KEYS[2] free zset chunk -> lease expiry in ms
-- KEYS[3] leases hash
-- KEYS[4] cursors hash
-- KEYS[5] stats hash
-- KEYS[6] fence counter
-- KEYS[7] the sink (a stream or a list), deleted only if ARGV[3] is 1
-- KEYS[8] the reset marker hash {op, keys, entries, released}
-- ARGV[1] the operation's id
-- ARGV[2] 1 to reset even while claims are running, else 0
-- ARGV[3] 1 to delete the sink too, else 0
-- ARGV[4] how long the marker stays, ms
-- returns {1, job keys deleted, sink entries deleted, running claims dropped};
--   {0, running claims} if refused; {-1, the sink's type} if the sink is neither
--   a stream nor a list (nothing deleted)

if redis.call('HGET', KEYS[8], 'op') == ARGV[1] then
    local done = redis.call('HMGET', KEYS[8], 'keys', 'entries', 'released')
    return {1, tonumber(done[1]), tonumber(done[2]), tonumber(done[3])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local running = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
if running > 0 and ARGV[2] ~= '1' then
    return {0, running}
end
local entries = 0
if ARGV[3] == '1' then
    local kind = redis.call('TYPE', KEYS[7])['ok']
    if kind == 'stream' then
        entries = redis.call('XLEN', KEYS[7])
    elseif kind == 'list' then
        entries = redis.call('LLEN', KEYS[7])
    elseif kind ~= 'none' then
        return {-1, kind}
    end
    redis.call('DEL', KEYS[7])
end
local deleted = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('DEL', KEYS[8])
redis.call('HSET', KEYS[8], 'op', ARGV[1], 'keys', deleted, 'entries', entries,
    'released', running)
redis.call('PEXPIRE', KEYS[8], tonumber(ARGV[4]))
return {1, deleted, entries, running}
