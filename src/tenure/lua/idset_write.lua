-- tenure script: idset_write
-- Append one write (ids added or removed, packed) to an id set's log.
-- on resend: ARGV[1] is fresh per call: the meta's "ops" field keeps it with its
--   reply for the last 32 writes, so a resent write answers that reply, appends nothing
-- KEYS[1] meta hash {epoch, version, log_start, base_pos, pending, bytes, crc, count, chunks}
-- KEYS[2] log list: writes by position; its first element is at position log_start
-- KEYS[3] base list: the compact form's chunks (only its type is checked here)
-- ARGV[1] a fresh epoch, taken if the set does not exist yet
-- ARGV[2] how many ids the write carries
-- ARGV[3...] the write's elements ("+" or "-", then little-endian uint32 ids)
-- returns {version, ids pending past the compact form, the log's end position, epoch}
--! include idset

local refused = idset_refuse_types(KEYS, {'hash', 'list', 'list'})
if refused then
    return redis.error_reply(refused)
end
local ops = redis.call('HGET', KEYS[1], 'ops') or ''
local seen = string.find(ops, ';' .. ARGV[1] .. ':', 1, true)
if seen then -- a resent call: its first run's reply
    local version, pending, log_end = string.match(ops, '^(%d+):(%d+):(%d+)',
        seen + #ARGV[1] + 2)
    return {tonumber(version), tonumber(pending), tonumber(log_end),
        redis.call('HGET', KEYS[1], 'epoch')}
end
if redis.call('HSETNX', KEYS[1], 'epoch', ARGV[1]) == 1 then
    redis.call('HSET', KEYS[1], 'log_start', 0, 'base_pos', 0, 'bytes', 0, 'crc', 0,
        'count', 0, 'chunks', 0)
end
local length = 0
for i = 3, #ARGV do
    length = redis.call('RPUSH', KEYS[2], ARGV[i])
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
local pending = redis.call('HINCRBY', KEYS[1], 'pending', tonumber(ARGV[2]))
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'log_start')
local log_end = tonumber(meta[2]) + length
-- the last 32 writes' ids and replies, for a resent call: ";id:version:pending:end"...
ops = ops .. ';' .. ARGV[1] .. ':' .. version .. ':' .. pending .. ':' .. log_end
local _, kept = string.gsub(ops, ';', '')
if kept > 32 then
    ops = string.sub(ops, string.find(ops, ';', 2, true))
end
redis.call('HSET', KEYS[1], 'ops', ops)
return {version, pending, log_end, meta[1]}
