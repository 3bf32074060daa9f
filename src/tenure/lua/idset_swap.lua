-- tenure script: idset_swap
-- A compaction's commit: the staged compact form becomes the base, all at once
-- (readers see the set before or after, never half of it).
-- on resend: the form in place is this one (same epoch, position, size, CRC,
--   count and chunks) and its stage is gone: answered 1, nothing changes
-- KEYS[1] meta hash {epoch, version, log_start, base_pos, pending, bytes, crc, count, chunks}
-- KEYS[2] log list: writes by position; its first element is at position log_start
-- KEYS[3] base list: the compact form's chunks (the writes before position base_pos)
-- KEYS[4] stage list: the new compact form's chunks, uploaded by the compactor
-- ARGV[1] the epoch the compactor read (the swap is refused if the set was cleared since)
-- ARGV[2] the position the new form covers (the writes before it)
-- ARGV[3] the new form's size in bytes
-- ARGV[4] its CRC-32
-- ARGV[5] how many ids it holds
-- ARGV[6] how many chunks it was cut into
-- ARGV[7] how many of the merged writes' ids the log may keep for readers behind
-- returns 1 if swapped, 0 if the set was cleared, a newer form is in place already, or
--         the stage is incomplete
--! include idset

local refused = idset_refuse_types(KEYS, {'hash', 'list', 'list', 'list'})
if refused then
    return redis.error_reply(refused)
end
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'base_pos', 'log_start')
local chunks = tonumber(ARGV[6])
local position = tonumber(ARGV[2])
local base_pos = tonumber(meta[2] or 0)
local log_start = tonumber(meta[3] or 0)
local log_end = log_start + redis.call('LLEN', KEYS[2])
if meta[1] == ARGV[1] and position == base_pos and redis.call('EXISTS', KEYS[4]) == 0 then
    local form = redis.call('HMGET', KEYS[1], 'bytes', 'crc', 'count', 'chunks')
    if form[1] == ARGV[3] and form[2] == ARGV[4] and form[3] == ARGV[5]
            and form[4] == ARGV[6] then
        return 1 -- this very form is in place: a resent call
    end
end
if meta[1] ~= ARGV[1] or position <= base_pos or position > log_end
        or redis.call('LLEN', KEYS[4]) ~= chunks then
    redis.call('DEL', KEYS[4])
    return 0
end
if chunks == 0 then
    redis.call('DEL', KEYS[3], KEYS[4])
else
    redis.call('RENAME', KEYS[4], KEYS[3])
    redis.call('PERSIST', KEYS[3])
end
-- The log keeps the latest merged writes, up to ARGV[7] ids and none from
-- before the previous compaction: a reader that recently was up to date
-- catches up from the log alone, and a bulk load leaves no copy of itself.
local merged = redis.call('LRANGE', KEYS[2], base_pos - log_start, position - log_start - 1)
local keep_from = position
local kept = 0
for i = #merged, 1, -1 do
    kept = kept + math.floor((#merged[i] - 1) / 4)
    if kept > tonumber(ARGV[7]) then
        break
    end
    keep_from = base_pos + i - 1
end
redis.call('LTRIM', KEYS[2], keep_from - log_start, -1)
local pending = 0
for _, element in ipairs(redis.call('LRANGE', KEYS[2], position - keep_from, -1)) do
    pending = pending + math.floor((#element - 1) / 4)
end
redis.call('HSET', KEYS[1], 'log_start', keep_from, 'base_pos', position, 'pending', pending,
    'bytes', ARGV[3], 'crc', ARGV[4], 'count', ARGV[5], 'chunks', chunks)
return 1
