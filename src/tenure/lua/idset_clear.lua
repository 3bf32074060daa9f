-- tenure script: idset_clear
-- Empty an id set: a new epoch with no compact form and no log, the version moved on.
-- on resend: the set's epoch is the one this call chose (ARGV[1], fresh per call):
--   nothing changes; the current version is answered
-- KEYS[1] meta hash {epoch, version, log_start, base_pos, pending, bytes, crc, count, chunks}
-- KEYS[2] log list: writes by position; its first element is at position log_start
-- KEYS[3] base list: the compact form's chunks
-- ARGV[1] the new epoch
-- returns the new version
--! include idset

local refused = idset_refuse_types(KEYS, {'hash', 'list', 'list'})
if refused then
    return redis.error_reply(refused)
end
if redis.call('HGET', KEYS[1], 'epoch') == ARGV[1] then
    return tonumber(redis.call('HGET', KEYS[1], 'version')) -- a resent call
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'log_start', 0, 'base_pos', 0, 'pending', 0,
    'bytes', 0, 'crc', 0, 'count', 0, 'chunks', 0)
return redis.call('HINCRBY', KEYS[1], 'version', 1)
