-- tenure script: semaphore_leave
-- An acquire is undone (cancelled, interrupted, failed, or answered past its
-- deadline): leave the queue, and pass on a permit granted to the caller
-- meanwhile (or taken by the call being undone); free permits go to the next
-- waiters. (Waiters giving up at their deadline leave through their line,
-- semaphore_line.)
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
-- ARGV[3] limit, if none is stored
-- ARGV[4] idle time in ms after which the counter and the limit expire
-- ARGV[5] the acquire call's id when the token is the caller's choice, else '': a
--         permit its token holds under another call's id is a second owner's, left alone
-- returns {0}
-- on resend: the caller's permit is gone (passed on, or never taken): nothing more changes

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
if expiry and not same_permit_attempt(grants, token, ARGV[5]) then
    expiry = false -- a second owner's permit of the same token: left alone
end
if expiry then
    drop_permit(holders, grants, owners, token)
end
local limit = tonumber(redis.call('GET', KEYS[7]) or ARGV[3])
grant_permits(holders, queue, waiters, wakes, fence, grants, limit, ARGV[2], now, ARGV[4],
    names, owners)
return {0}
