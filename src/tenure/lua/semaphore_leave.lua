-- tenure script: semaphore_leave
-- A waiter gives up, or an acquire is undone: leave the queue. A permit
-- granted to the caller meanwhile (or taken by the call being undone) is kept
-- (ARGV[3] = keep) or passed on (ARGV[3] = pass); free permits go to the next
-- waiters.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] fencing counter
-- KEYS[6] holders' fences hash
-- KEYS[7] the stored limit
-- KEYS[8] waiters' names hash: token -> owner name
-- KEYS[9] holders' names hash: token -> owner name
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] keep | pass
-- ARGV[4] limit, if none is stored
-- ARGV[5] idle time in ms after which the counter and the limit expire
-- ARGV[6] the acquire call's id when the token is the caller's choice, else '': a
--         permit its token holds under another call's id is a second owner's, left alone
-- returns {1, fence, remaining lease ms} if the caller keeps a permit (the
--         fence is 0 if the permit was not a grant), {0} otherwise
-- on resend: keep finds the permit kept (with its fence); pass finds it gone

--! include queue
--! include semaphore
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local token = ARGV[1]
local now = server_time()
leave_queue(queue, waiters, wakes, token, names)
purge_holders(holders, grants, now, owners)
purge_waiters(queue, waiters, wakes, now, names)
local expiry = redis.call('ZSCORE', holders, token)
local granted = redis.call('HGET', grants, token)
if expiry and not same_permit_attempt(grants, token, ARGV[6]) then
    expiry = false -- a second owner's permit of the same token: left alone
end
if expiry then
    if ARGV[3] == 'keep' then
        return {1, tonumber(granted or '0'), tonumber(expiry) - now}
    end
    drop_permit(holders, grants, owners, token)
end
local limit = tonumber(redis.call('GET', KEYS[7]) or ARGV[4])
grant_permits(holders, queue, waiters, wakes, fence, grants, limit, ARGV[2], now, ARGV[5],
    names, owners)
return {0}
