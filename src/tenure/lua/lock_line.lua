-- tenure script: lock_line
-- One process's line of waiters for a lock, in one call however many wait:
-- join the queue (a batch of the process's new waiters, in their order),
-- leave it (waiters that gave up and could not say so), refresh the
-- process's waiter lease (all its waiters at once), and hand a free lock to
-- the first waiter (its owner crashed, or nobody was there to hand it on).
-- KEYS[1] owner hash {token, fence, owner}, PEXPIRE = lease
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] fencing counter
-- KEYS[6] waiters' names hash: token -> owner name
-- ARGV[1] the process's wake-up channel (a pub/sub channel, not a key)
-- ARGV[2] waiter lease in ms
-- ARGV[3] handoff lease in ms, for granting a free lock to the first waiter
-- ARGV[4] lifetime in ms of a fencing counter started now
-- ARGV[5] how many waiters join (J), then how many leave (L)
-- ARGV[6] L
-- ARGV[7...] J pairs: token, owner name (in arrival order); then L tokens
-- returns {owner token ('' none), its fence (0 none), its remaining lease ms (-2 none),
--          1 if the process's waiter lease was alive before this call else 0,
--          server time in ms, then each joining waiter's 0-based place in line
--          (-1: it holds the lock: the owner token says so)}
-- on resend: joining again keeps each waiter's place (ZADD NX); leaving and
--         refreshing again change nothing more; a free lock is granted once

--! include queue
--! include lock
local owner_key, queue, waiters, wakes, fence, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local channel, waiter_lease, handoff, idle_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local joining, leaving = tonumber(ARGV[5]), tonumber(ARGV[6])
local now, now_us = server_time()
purge_waiters(queue, waiters, wakes, now, names)
local alive = refresh_channel(waiters, channel, now, waiter_lease)

local first_leave = 7 + 2 * joining
for i = first_leave, first_leave + leaving - 1 do
    local token = ARGV[i]
    leave_queue(queue, waiters, wakes, token, names)
    if redis.call('HGET', owner_key, 'token') == token then
        redis.call('DEL', owner_key)  -- handed to a waiter that is gone: pass it on
    end
end

local places = {}
local base = tonumber(now_us)
for i = 0, joining - 1 do
    local token, name = ARGV[7 + 2 * i], ARGV[8 + 2 * i]
    if redis.call('HGET', owner_key, 'token') ~= token then
        join_queue(queue, waiters, wakes, token, now, string.format('%d', base + i), waiter_lease,
            channel, names, name)
    end
end

local owner = redis.call('HGET', owner_key, 'token')
if not owner then
    owner = grant_next(owner_key, queue, waiters, wakes, fence, handoff, now, idle_ms, names)
end
for i = 0, joining - 1 do
    local token = ARGV[7 + 2 * i]
    if token == owner then
        places[#places + 1] = -1
    else
        places[#places + 1] = redis.call('ZRANK', queue, token) or -2
    end
end
local reply = {owner or '', 0, -2, alive and 1 or 0, now}
if owner then
    reply[2] = tonumber(redis.call('HGET', owner_key, 'fence'))
    reply[3] = redis.call('PTTL', owner_key)
end
for i = 1, #places do
    reply[#reply + 1] = places[i]
end
return reply
