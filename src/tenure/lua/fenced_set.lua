-- tenure script: fenced_set
-- Write a value guarded by a fencing token: refused if a newer token wrote first.
-- on resend: the write's id (ARGV[4], fresh per call) is among the last 8 the key
--   keeps (field "ops"): answered {1, its fence}, nothing written again, even after a
--   newer token wrote
-- KEYS[1] the guarded key: hash {value, fence, ops}
-- ARGV[1] the writer's fencing token (integer)
-- ARGV[2] the value
-- ARGV[3] time to live in ms (0 = none)
-- ARGV[4] the write's id (fresh per call; no spaces)
-- returns 1 written, 0 refused (the stored fence is newer), and the stored fence
--         as a second element: {1|0, fence}

local found = redis.call('HMGET', KEYS[1], 'fence', 'ops')
local stored = tonumber(found[1] or '-1')
local mine = tonumber(ARGV[1])
local ops = found[2] or ''
if string.find(' ' .. ops .. ' ', ' ' .. ARGV[4] .. ' ', 1, true) then
    return {1, mine} -- a resent call: written by its first run
end
if stored > mine then
    return {0, stored}
end
ops = ops == '' and ARGV[4] or (ops .. ' ' .. ARGV[4])
local _, kept = string.gsub(ops, ' ', '')
if kept >= 8 then
    ops = string.sub(ops, string.find(ops, ' ', 1, true) + 1)
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1], 'ops', ops)
if tonumber(ARGV[3]) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, mine}
