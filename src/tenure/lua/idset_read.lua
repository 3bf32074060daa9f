-- tenure script: idset_read
-- What a reader lacks of an id set: nothing, the log past its position, or all.
-- read only
-- KEYS[1] meta hash {epoch, version, log_start, base_pos, pending, bytes, crc, count, chunks}
-- KEYS[2] log list: writes by position; its first element is at position log_start
-- KEYS[3] base list: the compact form's chunks (the writes before position base_pos)
-- ARGV[1] the epoch of the reader's copy ('' for none)
-- ARGV[2] the copy's position: how many writes' elements it holds
-- returns {version, epoch, kind, start, {log elements from position start},
--          {bytes, crc, count, {chunks}}, base_pos}; kind 0: the copy is current; 1: apply
--          the elements; 2: the compact form and the elements past it
--! include idset

local refused = idset_refuse_types(KEYS, {'hash', 'list', 'list'})
if refused then
    return redis.error_reply(refused)
end
local meta = redis.call('HMGET', KEYS[1], 'version', 'epoch', 'log_start', 'base_pos', 'bytes',
    'crc', 'count')
local version = tonumber(meta[1] or 0)
local epoch = meta[2] or ''
local log_start = tonumber(meta[3] or 0)
local log_end = log_start + redis.call('LLEN', KEYS[2])
local position = tonumber(ARGV[2])
local base_pos = tonumber(meta[4] or 0)
if ARGV[1] == epoch and position >= log_start and position <= log_end then
    if position == log_end then
        return {version, epoch, 0, position, {}, {}, base_pos}
    end
    local elements = redis.call('LRANGE', KEYS[2], position - log_start, -1)
    return {version, epoch, 1, position, elements, {}, base_pos}
end
return {
    version, epoch, 2, base_pos, redis.call('LRANGE', KEYS[2], base_pos - log_start, -1),
    {meta[5] or '0', meta[6] or '0', meta[7] or '0', redis.call('LRANGE', KEYS[3], 0, -1)},
    base_pos,
}
