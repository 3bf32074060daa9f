-- tenure script: semaphore_release
-- Return the caller's permit and hand free permits to the first live waiters.
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
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] limit, if none is stored
-- ARGV[4] idle time in ms after which the counter, the limit and the receipt expire
-- ARGV[5] the fence of the permit being returned, or '' (not known): a permit the
--         token holds with another fence is another acquisition's (two owners that
--         chose one token, the first one's lease run out), left alone
-- returns 1 released, 0 the caller held no live permit (it had expired)
-- on resend: the token's receipt answers 1 (the first run released it)

--! include queue
--! include semaphore
--! include receipt
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local now = server_time()
local token, mine = ARGV[1], ARGV[5]
local expiry = redis.call('ZSCORE', holders, token)
local granted = redis.call('HGET', grants, token)
if expiry and mine ~= '' and granted ~= mine then
    expiry = false -- another acquisition's permit of this token: left alone
end
local released = 0
if expiry then
    drop_permit(holders, grants, owners, token)
    if tonumber(expiry) > now then
        released = 1
        give_release_receipt(KEYS[10], KEYS[11], token, granted, mine, ARGV[4])
    end
else
    -- Released already (a resend): the receipt of this acquisition of the token.
    released = tonumber(release_receipt(KEYS[10], KEYS[11], token, mine) or '0')
end
if redis.call('EXISTS', queue) == 1 then
    purge_holders(holders, grants, now, owners)
    purge_waiters(queue, waiters, wakes, now, names)
    local limit = tonumber(redis.call('GET', KEYS[7]) or ARGV[3])
    grant_permits(holders, queue, waiters, wakes, fence, grants, limit, ARGV[2], now, ARGV[4],
        names, owners)
end
return released
