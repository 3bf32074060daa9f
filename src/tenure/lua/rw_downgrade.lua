-- tenure script: rw_downgrade
-- Turn the caller's write hold into a read hold without letting go, then let
-- in the readers waiting at the head of the queue.
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
-- ARGV[1] the write token ("w...")
-- ARGV[2] the read token ("r...") that replaces it
-- ARGV[3] handoff lease in ms
-- ARGV[4] limit (the read-write lock's: no limit)
-- ARGV[5] idle time in ms after which the counter, the limit and the receipt expire
-- returns 1 downgraded, 0 the caller held no live write lock
-- on resend: the write token's receipt answers 1 (the first run downgraded it)

--! include queue
--! include semaphore
--! include receipt
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local now = server_time()
local expiry = redis.call('ZSCORE', holders, ARGV[1])
if not expiry or tonumber(expiry) <= now then
    return tonumber(receipt(KEYS[10], KEYS[11], ARGV[1]) or '0')
end
give_receipt(KEYS[10], KEYS[11], ARGV[1], 1, ARGV[5])
redis.call('ZREM', holders, ARGV[1])
redis.call('ZADD', holders, expiry, ARGV[2])
local f = redis.call('HGET', grants, ARGV[1])
redis.call('HDEL', grants, ARGV[1])
if f then
    redis.call('HSET', grants, ARGV[2], f)
end
local name = redis.call('HGET', owners, ARGV[1])
redis.call('HDEL', owners, ARGV[1])
if name then
    redis.call('HSET', owners, ARGV[2], name)
end
purge_waiters(queue, waiters, wakes, now, names)
grant_permits(holders, queue, waiters, wakes, fence, grants, tonumber(ARGV[4]), ARGV[3], now, ARGV[5],
    names, owners)
return 1
