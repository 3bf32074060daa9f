-- tenure script: fenced_set
-- Write a value guarded by a fencing token: refused if a newer token wrote first.
-- on resend: the stored fence equals the writer's: the same value written again;
--   refused only if a newer token wrote in between (the write was superseded)
-- KEYS[1] the guarded key: hash {value, fence}
-- ARGV[1] the writer's fencing token (integer)
-- ARGV[2] the value
-- ARGV[3] time to live in ms (0 = none)
-- returns 1 written, 0 refused (the stored fence is newer), and the stored fence
--         as a second element: {1|0, fence}

local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '-1')
local mine = tonumber(ARGV[1])
if stored > mine then
    return {0, stored}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
if tonumber(ARGV[3]) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, mine}
