-- tenure script: fenced_set
-- Write a value guarded by a fencing token: refused if a newer token ever wrote, even
-- one whose value has since expired.
-- on resend: the write's id (ARGV[4], fresh per call) is among the last 8 the fence
--   keeper keeps (field "ops"): answered {1, its fence}, nothing written again, even
--   after a newer token wrote or the value expired
-- KEYS[1] the guarded key: hash {value, fence}; expires with the write's time to live,
--   kept without one when the write gives none (as SET does)
-- KEYS[2] its fence keeper, same slot: hash {fence, ops}, never expires: the highest
--   token accepted and the ids of the last 8 writes outlive any value
-- ARGV[1] the writer's fencing token (integer)
-- ARGV[2] the value
-- ARGV[3] time to live in ms (0 = none)
-- ARGV[4] the write's id (fresh per call; no spaces)
-- returns 1 written, 0 refused (the stored fence is newer), and the stored fence
--         as a second element: {1|0, fence}

local kept = redis.call('HMGET', KEYS[2], 'fence', 'ops')
if not kept[1] then
    -- no keeper yet: a key written by an older tenure kept both in itself
    kept = redis.call('HMGET', KEYS[1], 'fence', 'ops')
end
local stored = tonumber(kept[1] or '-1')
local mine = tonumber(ARGV[1])
local ops = kept[2] or ''
if string.find(' ' .. ops .. ' ', ' ' .. ARGV[4] .. ' ', 1, true) then
    return {1, mine} -- a resent call: written by its first run
end
if stored > mine then
    return {0, stored}
end
ops = ops == '' and ARGV[4] or (ops .. ' ' .. ARGV[4])
local _, spaces = string.gsub(ops, ' ', '')
if spaces >= 8 then
    ops = string.sub(ops, string.find(ops, ' ', 1, true) + 1)
end
redis.call('HSET', KEYS[2], 'fence', ARGV[1], 'ops', ops)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
if tonumber(ARGV[3]) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, mine}
