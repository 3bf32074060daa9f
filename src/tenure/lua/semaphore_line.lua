-- tenure script: semaphore_line
-- One process's line of waiters for a semaphore (or read-write lock), in one
-- call however many wait: join the queue (a batch of the process's new
-- waiters, in their order), leave it (waiters that gave up and could not say
-- so), refresh the process's waiter lease (all its waiters at once), and hand
-- free permits to the waiters at the head (a holder crashed, or nobody was
-- there to hand them on).
-- KEYS[1] holders zset: token -> permit expiry (ms, server clock)
-- KEYS[2] queue zset: token -> arrival (us, server clock)
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] fencing counter
-- KEYS[6] holders' fences hash: token -> fence
-- KEYS[7] the stored limit
-- KEYS[8] waiters' names hash: token -> owner name
-- KEYS[9] holders' names hash: token -> owner name
-- ARGV[1] the process's wake-up channel (a pub/sub channel, not a key)
-- ARGV[2] waiter lease in ms
-- ARGV[3] handoff lease in ms, for granting free permits to the first waiters
-- ARGV[4] idle time in ms after which the counter and the limit expire
-- ARGV[5] how many waiters join (J), then how many leave (L)
-- ARGV[6] L
-- ARGV[7] a waiter of the process that joined in an earlier round ('' none), to check
--         that its place is still there (see the reply)
-- ARGV[8] how many waiters give up (K): each leaves the line, but keeps a permit
--         granted to it meanwhile (the reply names it)
-- ARGV[9] limit: how many permits exist (must match the stored one)
-- ARGV[10...] J pairs: waiter, owner name (in arrival order); then L waiters (a
--         permit granted to one of them is passed on); then K waiters. A waiter
--         is its token, or "token\0call id" for a token of the caller's choosing:
--         a permit of that token taken by another acquire call (a second owner
--         that chose it) is not that waiter's, and it does not queue while that
--         permit lasts (its line joins it again later: the reply names it with
--         fence 0)
-- returns {0, ms until the first permit expires (-2 none), 1 if the process's
--          waiter lease was alive before this call else 0, server time in ms,
--          1 if the waiter to check neither waits nor holds a permit (its
--          process's places were dropped, or its grant lapsed unseen: its line
--          joins its waiters again) else 0, then for each joiner, waiter giving
--          up (and the waiter checked) that holds a permit: token, fence,
--          remaining ms; and for each joiner whose token another call holds:
--          token, 0, that permit's remaining ms}, or
--         {2, stored limit} if the stored limit differs from ARGV[9]
-- on resend: joining again keeps each waiter's place (ZADD NX), and one that
--         holds a permit is answered its grant again; leaving, giving up and
--         refreshing again change nothing more; free permits are granted once

--! include queue
--! include semaphore
local holders, queue, waiters, wakes, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local names, owners = KEYS[8], KEYS[9]
local channel, waiter_lease, handoff, idle_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local joining, leaving = tonumber(ARGV[5]), tonumber(ARGV[6])
local limit, differs = stored_limit(KEYS[7], ARGV[9], idle_ms)
if differs then
    return {2, limit}
end
local now, now_us = server_time()
purge_holders(holders, grants, now, owners)
purge_waiters(queue, waiters, wakes, now, names)
local alive = refresh_channel(waiters, channel, now, waiter_lease)

local held = {}  -- waiters of this process that hold a permit already
local check, check_attempt = line_entry(ARGV[7])
local missing = 0
if check ~= '' and not redis.call('ZSCORE', queue, check) then
    if redis.call('ZSCORE', holders, check) and same_permit_attempt(grants, check, check_attempt) then
        held[#held + 1] = check
    else
        missing = 1
    end
end

local first_leave = 10 + 2 * joining
for i = first_leave, first_leave + leaving - 1 do
    local token, attempt = line_entry(ARGV[i])
    leave_queue(queue, waiters, wakes, token, names)
    if redis.call('ZSCORE', holders, token) and same_permit_attempt(grants, token, attempt) then
        drop_permit(holders, grants, owners, token)  -- granted to a waiter that is gone
    end
end
for i = first_leave + leaving, first_leave + leaving + tonumber(ARGV[8]) - 1 do
    local token, attempt = line_entry(ARGV[i])
    leave_queue(queue, waiters, wakes, token, names)
    if token ~= check and redis.call('ZSCORE', holders, token)
            and same_permit_attempt(grants, token, attempt) then
        held[#held + 1] = token  -- granted meanwhile: it keeps the permit
    end
end

-- The batch joins in its order; a waiter already in line keeps its place,
-- one that holds a permit (granted while its wake-up went unheard) is answered.
local others = {}  -- joiners whose token a permit of another call holds
join_batch(queue, wakes, names, channel, now_us, 10, joining, function(token, attempt)
    if redis.call('ZSCORE', holders, token) then
        if not same_permit_attempt(grants, token, attempt) then
            others[#others + 1] = token
        elseif token ~= check then
            held[#held + 1] = token
        end
        return true
    end
    return false
end)
-- The line's keys live while some process refreshes (joins alone do not
-- come often enough once everyone is in line).
keep_alive(queue, waiter_lease * 2)
keep_alive(wakes, waiter_lease * 2)
keep_alive(names, waiter_lease * 2)

grant_permits(holders, queue, waiters, wakes, fence, grants, limit, handoff, now, idle_ms,
    names, owners)

local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
local ttl = -2
if first[2] then
    ttl = tonumber(first[2]) - now
end
local reply = {0, ttl, alive and 1 or 0, now, missing}
for _, token in ipairs(held) do
    local expiry = redis.call('ZSCORE', holders, token)
    if expiry then
        reply[#reply + 1] = token
        reply[#reply + 1] = tonumber(redis.call('HGET', grants, token) or '0')
        reply[#reply + 1] = tonumber(expiry) - now
    end
end
for _, token in ipairs(others) do
    local expiry = redis.call('ZSCORE', holders, token)
    if expiry then
        reply[#reply + 1] = token
        reply[#reply + 1] = 0
        reply[#reply + 1] = tonumber(expiry) - now
    end
end
return reply
