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

--! include queue
--! include lock
--! include receipt
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
