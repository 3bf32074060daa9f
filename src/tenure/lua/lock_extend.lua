-- tenure script: lock_extend
-- Extend or reset the lease of a lock the token owns.
-- on resend: (pending: the lead's)
-- KEYS[1] owner hash {token, fence, count, owner}
-- ARGV[1] token
-- ARGV[2] milliseconds
-- ARGV[3] add (remaining lease + ms) | set (lease becomes ms)
-- returns the new remaining lease in ms, or 0 if the token does not own the lock

if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
    return 0
end
local ms = tonumber(ARGV[2])
if ARGV[3] == 'add' then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then
        ms = ms + left
    end
end
redis.call('PEXPIRE', KEYS[1], ms)
return ms
