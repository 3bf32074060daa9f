-- tenure script: redlock_acquire
-- One master's part of a Redlock acquisition: take the lock here if it is
-- free and the caller is first in line; else (when asked) wait in line.
-- The line is ordered by a ticket the caller chose (its clock when it began
-- to acquire), so every master agrees on who is first and hands the free lock
-- to the same caller: contenders do not split the masters between them.
-- KEYS[1] owner hash {token, fence, attempt, owner, call}, PEXPIRE = lease
-- KEYS[2] queue zset: token -> ticket
-- KEYS[3] waiter leases zset: channel -> expiry (ms, server clock) of each waiting process
-- KEYS[4] waiters' channels hash: token -> pub/sub channel of its process
-- KEYS[5] fencing counter
-- KEYS[6] receipts hash (lib/receipt): an attempt given back already has one
-- KEYS[7] the receipts' previous generation
-- ARGV[1] token
-- ARGV[2] lease in ms
-- ARGV[3] waiter lease in ms; 0 = do not wait in line (a first or non-blocking attempt)
-- ARGV[4] ticket (an integer: microseconds of the caller's clock)
-- ARGV[5] the caller's wake-up channel (a pub/sub channel, not a key)
-- ARGV[6] lifetime in ms of the fencing counter, renewed on each use
-- ARGV[7] the attempt's id, a number growing with each attempt of the caller (a late
--         grant of a failed attempt is given back by it, never one of the same
--         token's later attempt)
-- ARGV[8] the caller's owner name (shown by tenure inspect)
-- ARGV[9] the acquire call's id when the caller chose the token ('' for a random
--         token, unique to its acquisition): a second owner that chose the same
--         token is refused while the first holds, and its give-backs leave that
--         hold alone (redlock_release)
-- returns {1, fence, lease ms} when the caller holds the lock on this master,
--         {0, owner's remaining lease ms (-2 none), 0-based place in line (-1 none)}
-- on resend: the token holds already (answered as "ours already"), or keeps
--         its place in line (ZADD NX)
-- late: a call of an attempt that was given back already (its give-back came
--         first, and left a receipt) takes nothing and answers as a refusal,
--         even where an earlier attempt of the token holds the lock here (that
--         attempt's own give-back releases it)

--! include queue
--! include redlock
--! include receipt
local owner_key, queue, waiters, wakes, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, lease, ticket, channel = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
local waiter_lease = tonumber(ARGV[3])
local call = ARGV[9] or ''

local owner = redis.call('HGET', owner_key, 'token')
if receipt(KEYS[6], KEYS[7], attempt_id(token, call, ARGV[7])) then
    -- This attempt ended (failed) and was given back before this call arrived.
    -- Nor does it take over an earlier attempt's grant still here: marked as
    -- this attempt's, it would outlive that attempt's give-back (on its way).
    local place = redis.call('ZRANK', queue, token)
    return {0, redis.call('PTTL', owner_key), place or -1}
end
if owner == token and (redis.call('HGET', owner_key, 'call') or '') ~= call then
    -- Held by a second owner that chose the same token: not this call's.
    local place = redis.call('ZRANK', queue, token)
    return {0, redis.call('PTTL', owner_key), place or -1}
end
if owner == token then
    -- Ours already (an earlier attempt's grant not given back yet): this attempt's
    -- now -- unless this call is an earlier attempt's, arriving late (delayed on
    -- the way): it must not mark the grant as that attempt's, whose give-back
    -- would then release the later attempt's hold.
    local current = tonumber(redis.call('HGET', owner_key, 'attempt') or '0') or 0
    if tonumber(ARGV[7]) >= current then
        redis.call('HSET', owner_key, 'attempt', ARGV[7])
    end
    redis.call('HSET', owner_key, 'owner', ARGV[8])
    redis.call('PEXPIRE', owner_key, lease)
    leave_queue(queue, waiters, wakes, token)
    return {1, tonumber(redis.call('HGET', owner_key, 'fence')), tonumber(lease)}
end

local now = server_time()
purge_waiters(queue, waiters, wakes, now)
if waiter_lease > 0 then
    redis.call('ZADD', queue, 'NX', ticket, token)
    refresh_channel(waiters, channel, now, waiter_lease)
    redis.call('HSET', wakes, token, channel)
    keep_alive(queue, waiter_lease * 2)
    keep_alive(wakes, waiter_lease * 2)
end

if not owner then
    local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if #head == 0 or head[1] == token or tonumber(ticket) < tonumber(head[2]) then
        leave_queue(queue, waiters, wakes, token)
        local f = next_redlock_fence(fence, ARGV[6])
        redis.call('HSET', owner_key, 'token', token, 'fence', string.format('%d', f),
            'attempt', ARGV[7], 'owner', ARGV[8])
        if call ~= '' then
            redis.call('HSET', owner_key, 'call', call)
        end
        redis.call('PEXPIRE', owner_key, lease)
        return {1, f, tonumber(lease)}
    end
end

local place = redis.call('ZRANK', queue, token)
return {0, redis.call('PTTL', owner_key), place or -1}
