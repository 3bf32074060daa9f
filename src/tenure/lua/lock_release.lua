-- tenure script: lock_release
-- Release the lock if the token owns it, handing it straight to the first
-- live waiter (who becomes the owner here, so no newcomer can barge in).
-- on resend: (pending: the lead's)
-- KEYS[1] owner hash {token, fence, count, owner}
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] fencing counter
-- KEYS[6] waiters' names hash
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] lifetime in ms of a fencing counter started now
-- returns 0 not owned by the token, 1 released (and handed on if anyone
--         waited), 2 still held (a re-entrant hold counted down)

--! include queue
--! include lock
local owner_key, queue, waiters, wakes, fence, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner = redis.call('HMGET', owner_key, 'token', 'count')
if owner[1] ~= ARGV[1] then
    return 0
end
if owner[2] and tonumber(owner[2]) > 0 then
    redis.call('HINCRBY', owner_key, 'count', -1)
    return 2
end
if redis.call('EXISTS', queue) == 1 then
    local now = server_time()
    purge_waiters(queue, waiters, wakes, now, names)
    if grant_next(owner_key, queue, waiters, wakes, fence, ARGV[2], now, ARGV[3], names) then
        return 1  -- the owner hash now names the next waiter
    end
end
redis.call('DEL', owner_key)
return 1
