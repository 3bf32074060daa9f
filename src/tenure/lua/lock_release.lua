-- tenure script: lock_release
-- Release the lock if the token owns it, handing it straight to the first
-- live waiter (who becomes the owner here, so no newcomer can barge in).
-- KEYS[1] owner hash (lib/lock)
-- KEYS[2] queue zset
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] waiters' names hash
-- KEYS[6] optional: redis-py's key of the lock, `name` (interop="redis-py"; see lib/lock)
-- ARGV[1] token
-- ARGV[2] handoff lease in ms
-- ARGV[3] how long in ms the marker a release leaves lives (its fence and receipt)
-- ARGV[4] the fence of the hold being released, or '' (not known): a hold the
--         token has with another fence is another acquisition's (two owners that
--         chose one token, the first one's lease run out), left alone
-- returns 0 not owned by the token (with KEYS[6], also when redis-py's key no longer
--         holds it: the hold was lost, and tenure's side of it is cleared), 1 released
--         (and handed on if anyone waited)
-- on resend: the receipt of the token (and fence) answers 1 (the first run released it),
--         until the name's next release

--! include queue
--! include lock
mirror = KEYS[6] or false
local owner_key, queue, waiters, wakes, names = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, mine = ARGV[1], ARGV[4]
local held = redis.call('HMGET', owner_key, 'token', 'fence', 'done')
if held[1] ~= token or (mine ~= '' and held[2] ~= mine) then
    -- Released already (a resend): the receipt of this acquisition of the token.
    local done = held[3]
    if done and (done == token .. ':' .. mine
            or (mine == '' and string.sub(done, 1, #token + 1) == token .. ':')) then
        return 1
    end
    return 0
end
local done = 1
if not still_owner(owner_key, token) then
    done = 0  -- redis-py's key was taken from under the hold: it was lost, nothing to release
else
    redis.call('HSET', owner_key, 'done', token .. ':' .. held[2])
    mirror_release(token)
end
if redis.call('EXISTS', queue) == 1 and not outsider() then
    local now = server_time()
    purge_waiters(queue, waiters, wakes, now, names)
    -- the fence read above, unless still_owner cleared the hash
    local last = done == 1 and held[2] or false
    if grant_next(owner_key, queue, waiters, wakes, ARGV[2], now, names, last) then
        return done  -- the owner hash now names the next waiter
    end
end
if done == 1 then
    let_go(owner_key, ARGV[3])
end
return done
