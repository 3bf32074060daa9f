-- tenure script: lock_line
-- One process's line of waiters for a lock, in one call however many wait:
-- join the queue (a batch of the process's new waiters, in their order),
-- leave it (waiters that gave up and could not say so), refresh the
-- process's waiter lease (all its waiters at once), and hand a free lock to
-- the first waiter (its owner crashed, or nobody was there to hand it on).
-- KEYS[1] owner hash (lib/lock), PEXPIRE = lease
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] waiters' names hash: token -> owner name
-- KEYS[6] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] the process's wake-up channel (a pub/sub channel, not a key)
-- ARGV[2] waiter lease in ms
-- ARGV[3] handoff lease in ms, for granting a free lock to the first waiter
-- ARGV[4] how long in ms the marker of a lock let go here lives (lib/lock)
-- ARGV[5] how many waiters join (J), then how many leave (L)
-- ARGV[6] L
-- ARGV[7] a waiter of the process that joined in an earlier round ('' none), to check
--         that its place is still there (see the reply)
-- ARGV[8] how many waiters give up (K): each leaves the line, but keeps the lock
--         if it was handed to it meanwhile (the reply names the owner)
-- ARGV[9...] J pairs: waiter, owner name (in arrival order); then L waiters (a lock
--         handed to one of them is passed on); then K waiters. A waiter is its
--         token, or "token\0call id" for a token of the caller's choosing: a hold
--         of that token taken by another acquire call (a second owner that chose
--         it) is not that waiter's (line_entry in lib/queue, same_attempt in lib/lock)
-- returns {owner token ('' none), its fence (0 none), its remaining lease ms (-2 none),
--          1 if the process's waiter lease was alive before this call else 0,
--          server time in ms, 1 if the waiter to check is neither in line nor
--          the owner (its process's places were dropped, or its grant lapsed
--          unseen: its line joins its waiters again) else 0,
--          1 if a foreign holder of redis-py's key holds it (no owner named;
--          the third entry is that key's remaining ms, -1 never) else 0,
--          the id of the acquire call that took the owner's hold ('' none, or handed over)}
-- on resend: joining again keeps each waiter's place (ZADD NX); leaving, giving
--         up and refreshing again change nothing more; a free lock is granted once

--! include queue
--! include lock
mirror = KEYS[6] or false
local owner_key, queue, waiters, wakes, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local channel, waiter_lease, handoff, idle_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local joining, leaving = tonumber(ARGV[5]), tonumber(ARGV[6])
local now, now_us = server_time()
purge_waiters(queue, waiters, wakes, now, names)
local alive = refresh_channel(waiters, channel, now, waiter_lease)

local check, check_attempt = line_entry(ARGV[7])
local missing = 0
if check ~= '' and not redis.call('ZSCORE', queue, check)
        and not (redis.call('HGET', owner_key, 'token') == check
            and same_attempt(owner_key, check_attempt)) then
    missing = 1
end

local first_leave = 9 + 2 * joining
for i = first_leave, first_leave + leaving - 1 do
    local token, attempt = line_entry(ARGV[i])
    leave_queue(queue, waiters, wakes, token, names)
    if redis.call('HGET', owner_key, 'token') == token and same_attempt(owner_key, attempt) then
        let_go(owner_key, idle_ms)  -- handed to a waiter that is gone: pass it on
        mirror_release(token)
    end
end
for i = first_leave + leaving, first_leave + leaving + tonumber(ARGV[8]) - 1 do
    leave_queue(queue, waiters, wakes, (line_entry(ARGV[i])), names)  -- a lock handed to it stays its
end

local owner = redis.call('HGET', owner_key, 'token')
-- The batch joins in its order; a waiter already in line keeps its place.
-- (A hold of its token taken by another call queues it: it is handed the lock after.)
join_batch(queue, wakes, names, channel, now_us, 9, joining, function(token, attempt)
    return token == owner and same_attempt(owner_key, attempt)
end)
-- The line's keys live while some process refreshes (joins alone do not
-- come often enough once everyone is in line).
keep_alive(queue, waiter_lease * 2)
keep_alive(wakes, waiter_lease * 2)
keep_alive(names, waiter_lease * 2)

local held_outside = (not owner) and outsider()
if not owner and not held_outside then
    owner = grant_next(owner_key, queue, waiters, wakes, handoff, now, names)
end
local reply = {owner or '', 0, -2, alive and 1 or 0, now, missing, held_outside and 1 or 0, ''}
if owner then
    local fence, attempt = unpack(redis.call('HMGET', owner_key, 'fence', 'attempt'))
    reply[2] = tonumber(fence)
    reply[3] = redis.call('PTTL', owner_key)
    reply[8] = attempt or ''
elseif held_outside then
    reply[3] = redis.call('PTTL', mirror)
end
return reply
