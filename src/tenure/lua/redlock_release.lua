-- tenure script: redlock_release
-- One master's part of a Redlock release: give the lock up here if the token
-- holds it, and leave the line (or keep one's place, after an attempt that
-- fell short of a quorum); the first waiter in line is told to try again.
-- KEYS[1] owner hash {token, fence, attempt, owner, call}
-- KEYS[2] queue zset: token -> ticket
-- KEYS[3] waiter leases zset
-- KEYS[4] waiters' channels hash
-- KEYS[5] receipts hash (lib/receipt)
-- KEYS[6] the receipts' previous generation
-- ARGV[1] token
-- ARGV[2] leave (go out of line too) | stay (keep one's place in line)
-- ARGV[3] an attempt's id: release only that attempt's grant ('' = any of the token's)
-- ARGV[4] lifetime in ms of the receipt
-- ARGV[5] the acquire call's id when the token was the caller's choice ('' none):
--         only a grant of that call is released (a second owner that chose the
--         same token gives back nothing of the first one's hold)
-- returns 1 if the token held the lock here, 0 otherwise
-- a give-back of an attempt (ARGV[3] given) that finds no grant of it leaves
--         a receipt answering 0: that attempt's acquire, arriving later (delayed
--         on the way, or resent), then takes nothing (redlock_acquire)
-- on resend: the receipt of the token and attempt answers 1 (the first run
--         released it); leaving the line again changes nothing

--! include queue
--! include redlock
--! include receipt
local owner_key, queue, waiters, wakes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token = ARGV[1]
local call = ARGV[5] or ''
local owner = redis.call('HMGET', owner_key, 'token', 'attempt', 'call')
local held = owner[1] == token and (ARGV[3] == '' or owner[2] == ARGV[3])
    and (call == '' or owner[3] == call)
if ARGV[2] == 'leave' then
    leave_queue(queue, waiters, wakes, token)
end
local id = attempt_id(token, call, ARGV[3])
if held then
    give_receipt(KEYS[5], KEYS[6], id, 1, ARGV[4])
    redis.call('DEL', owner_key)
    wake_first(queue, waiters, wakes)
    return 1
end
local first = receipt(KEYS[5], KEYS[6], id)
if not first and ARGV[3] ~= '' then
    give_receipt(KEYS[5], KEYS[6], id, 0, ARGV[4])
end
return tonumber(first or '0')
