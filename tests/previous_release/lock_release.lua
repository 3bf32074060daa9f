-- tenure script: lock_release
-- Release the lock if the token owns it, handing it straight to the first
-- live waiter (who becomes the owner here, so no newcomer can barge in).
-- KEYS[1] owner hash {token, fence, owner}
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] fencing counter
-- KEYS[6] waiters' names hash
-- KEYS[7] receipts hash (lib/receipt)
-- KEYS[8] the receipts' previous generation
-- KEYS[9] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] lifetime in ms of a fencing counter started now, and of the receipt
-- ARGV[4] the fence of the hold being released, or '' (not known): a hold the
--         token has with another fence is another acquisition's (two owners that
--         chose one token, the first one's lease run out), left alone
-- returns 0 not owned by the token (with KEYS[9], also when redis-py's key no longer
--         holds it: the hold was lost, and tenure's side of it is cleared), 1 released
--         (and handed on if anyone waited)
-- on resend: the receipt of the token (and fence) answers 1 (the first run released it)

local function server_time()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
        t[1] .. string.format('%06d', tonumber(t[2]))
end
local function next_fence(fence, idle_ms)
    local f = redis.call('INCR', fence)
    if f == 1 then
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', fence, string.format('%d', f), 'PX', idle_ms)
    end
    return f
end
local function leave_queue(queue, waiters, wakes, token, names)
    redis.call('ZREM', queue, token)
    redis.call('HDEL', wakes, token)
    if names then
        redis.call('HDEL', names, token)
    end
end
local function purge_waiters(queue, waiters, wakes, now, names)
    local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', string.format('%d', now))
    if #dead == 0 then
        return
    end
    local gone = {}
    for i = 1, #dead do
        gone[dead[i]] = true
        redis.call('ZREM', waiters, dead[i])
    end
    local all = redis.call('HGETALL', wakes)
    for i = 1, #all, 2 do
        if gone[all[i + 1]] then
            leave_queue(queue, waiters, wakes, all[i], names)
        end
    end
end
local function name_of(names, token)
    if not names then
        return false
    end
    return redis.call('HGET', names, token)
end
local function channel_of(wakes, token)
    return redis.call('HGET', wakes, token)
end
local function announce(channel, token, fence, handoff_ms, now)
    if channel then
        redis.pcall('PUBLISH', channel,
            token .. ':' .. string.format('%d', fence) .. ':' .. handoff_ms .. ':' .. string.format('%d', now))
    end
end
local mirror = false
local function outsider()
    return mirror and redis.call('EXISTS', mirror) == 1
end
local function still_owner(owner_key, owner)
    if owner and mirror and redis.call('GET', mirror) ~= owner then
        redis.call('DEL', owner_key)
        return false
    end
    return owner
end
local function mirror_release(token)
    if mirror and redis.call('GET', mirror) == token then
        redis.call('DEL', mirror)
    end
end
local function take(owner, fence, token, lease_ms, idle_ms, name, attempt)
    local f = next_fence(fence, idle_ms)
    if name then
        redis.call('HSET', owner, 'token', token, 'fence', string.format('%d', f), 'owner', name,
            'attempt', attempt)
    else
        redis.call('HSET', owner, 'token', token, 'fence', string.format('%d', f),
            'attempt', attempt)
        redis.call('HDEL', owner, 'owner')
    end
    redis.call('PEXPIRE', owner, lease_ms)
    if mirror then
        redis.call('SET', mirror, token, 'PX', lease_ms)
    end
    return f
end
local function grant_next(owner, queue, waiters, wakes, fence, handoff_ms, now, idle_ms, names)
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
        return false
    end
    local channel = channel_of(wakes, head)
    local name = name_of(names, head)
    leave_queue(queue, waiters, wakes, head, names)
    local f = take(owner, fence, head, handoff_ms, idle_ms, name, '')
    announce(channel, head, f, handoff_ms, now)
    return head
end
local RECEIPT_CAP = 1000
local function receipt(done, done_old, id)
    return redis.call('HGET', done, id) or redis.call('HGET', done_old, id)
end
local function give_receipt(done, done_old, id, reply, receipt_ms)
    if redis.call('HLEN', done) >= RECEIPT_CAP then
        redis.call('RENAME', done, done_old)
    end
    redis.call('HSET', done, id, reply)
    redis.call('PEXPIRE', done, receipt_ms)
end
local function release_receipt(done, done_old, token, mine)
    if mine ~= '' then
        return receipt(done, done_old, token .. ':' .. mine)
    end
    return receipt(done, done_old, token)
end
local function give_release_receipt(done, done_old, token, fence, mine, receipt_ms)
    give_receipt(done, done_old, token .. ':' .. (fence or ''), 1, receipt_ms)
    if mine == '' then
        give_receipt(done, done_old, token, 1, receipt_ms)
    end
end
mirror = KEYS[9] or false
local owner_key, queue, waiters, wakes, fence, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, mine = ARGV[1], ARGV[4]
local held = redis.call('HMGET', owner_key, 'token', 'fence')
if held[1] ~= token or (mine ~= '' and held[2] ~= mine) then
    -- Released already (a resend): the receipt of this acquisition of the token.
    return tonumber(release_receipt(KEYS[7], KEYS[8], token, mine) or '0')
end
local done = 1
if not still_owner(owner_key, token) then
    done = 0  -- redis-py's key was taken from under the hold: it was lost, nothing to release
else
    give_release_receipt(KEYS[7], KEYS[8], token, held[2], mine, ARGV[3])
    mirror_release(token)
end
if redis.call('EXISTS', queue) == 1 and not outsider() then
    local now = server_time()
    purge_waiters(queue, waiters, wakes, now, names)
    if grant_next(owner_key, queue, waiters, wakes, fence, ARGV[2], now, ARGV[3], names) then
        return done  -- the owner hash now names the next waiter
    end
end
redis.call('DEL', owner_key)
return done
