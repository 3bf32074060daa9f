-- tenure script: lock_extend
-- Extend or reset the lease of a lock the token owns.
-- KEYS[1] owner hash {token, fence, owner}
-- KEYS[2] receipts hash (lib/receipt)
-- KEYS[3] the receipts' previous generation
-- KEYS[4] optional: redis-py's key of the lock, `name` (interop="redis-py"): it
--         must hold the token too, and follows the new lease
-- ARGV[1] token
-- ARGV[2] milliseconds
-- ARGV[3] add (remaining lease + ms) | set (lease becomes ms)
-- ARGV[4] add: the call's id (a fresh random id per call); set: ''
-- ARGV[5] lifetime in ms of the receipt an add leaves
-- ARGV[6] the fence of the hold being extended, or '' (not known, or a Redlock
--         master's): a hold of the token with another fence is not this one
-- ARGV[7] a Redlock's acquire call id when its token was chosen, or '': a hold of
--         the token by another call (owner-hash field `call`) is not this one
-- returns the new remaining lease in ms, or 0 if the token does not own the lock
-- on resend: set sets the same lease again; add finds its receipt and answers
--         the lease it set, adding nothing

--! include receipt
local held = redis.call('HMGET', KEYS[1], 'token', 'fence', 'call')
if held[1] ~= ARGV[1] or (ARGV[6] ~= '' and held[2] ~= ARGV[6])
    or (ARGV[7] ~= '' and held[3] ~= ARGV[7]) then
    return 0
end
if KEYS[4] and redis.call('GET', KEYS[4]) ~= ARGV[1] then
    return 0  -- redis-py's key was taken from under the hold: it is lost
end
local ms = tonumber(ARGV[2])
if ARGV[3] == 'add' then
    local done = receipt(KEYS[2], KEYS[3], ARGV[4])
    if done then
        return tonumber(done)
    end
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then
        ms = ms + left
    end
    give_receipt(KEYS[2], KEYS[3], ARGV[4], ms, ARGV[5])
end
redis.call('PEXPIRE', KEYS[1], ms)
if KEYS[4] then
    redis.call('PEXPIRE', KEYS[4], ms)
end
return ms
