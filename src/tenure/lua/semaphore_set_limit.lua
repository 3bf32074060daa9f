-- tenure script: semaphore_set_limit
-- Change the semaphore's stored limit (the explicit call every user's limit
-- is checked against); a larger limit lets the waiters at the head in now.
-- KEYS[1] holders zset
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] fencing counter
-- KEYS[6] holders' fences hash
-- KEYS[7] the stored limit
-- KEYS[8] waiters' names hash: token -> owner name
-- KEYS[9] holders' names hash: token -> owner name
-- KEYS[10] receipts hash (lib/receipt)
-- KEYS[11] the receipts' previous generation
-- ARGV[1] the new limit
-- ARGV[2] handoff lease in ms
-- ARGV[3] idle time in ms after which the counter, the limit and the receipt expire
-- ARGV[4] the call's id (a fresh random id per call)
-- returns the previous stored limit (0: none was stored)
-- on resend: the call's receipt answers the limit it replaced; nothing changes

--! include queue
--! include semaphore
--! include receipt
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local done = receipt(KEYS[10], KEYS[11], ARGV[4])
if done then
    return tonumber(done)
end
local previous = tonumber(redis.call('GET', KEYS[7]) or '0')
give_receipt(KEYS[10], KEYS[11], ARGV[4], previous, ARGV[3])
redis.call('SET', KEYS[7], ARGV[1], 'PX', ARGV[3])
local now = server_time()
purge_holders(holders, grants, now, owners)
purge_waiters(queue, waiters, wakes, now, names)
grant_permits(holders, queue, waiters, wakes, fence, grants, tonumber(ARGV[1]), ARGV[2], now, ARGV[3],
    names, owners)
return previous
