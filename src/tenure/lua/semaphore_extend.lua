-- tenure script: semaphore_extend
-- Extend or reset the lease of the caller's permit.
-- KEYS[1] holders zset
-- KEYS[2] the stored limit (kept alive while permits are held)
-- KEYS[3] holders' names hash: token -> owner name
-- KEYS[4] holders' fences hash: token -> fence
-- KEYS[5] receipts hash (lib/receipt)
-- KEYS[6] the receipts' previous generation
-- ARGV[1] token
-- ARGV[2] milliseconds
-- ARGV[3] add (remaining lease + ms) | set (lease becomes ms)
-- ARGV[4] idle time in ms after which the limit and the receipt expire
-- ARGV[5] add: the call's id (a fresh random id per call); set: ''
-- ARGV[6] the token this hold carries once downgraded (a read-write lock's write
--         side: "r" and the rest of its "w" token), or ''. A renewal sent under
--         the write token that reaches the server after the downgrade renews the
--         read hold: the owner still holds, under the token it is changing to
-- ARGV[7] the fence of the permit being confirmed or renewed, or '' (not known): a
--         permit the token holds with another fence is another acquisition's (the
--         token queued again and handed a newer permit after a grant lapsed
--         unconfirmed, or two owners that chose one token), left alone
-- returns the new remaining lease in ms, or 0 if the caller holds no live permit
-- on resend: set sets the same expiry again (a few ms later); add finds its
--         receipt and answers the lease it set, adding nothing

--! include queue
--! include semaphore
--! include receipt
local now = server_time()
local token = ARGV[1]
local expiry = redis.call('ZSCORE', KEYS[1], token)
if not expiry and ARGV[6] ~= '' then
    local downgraded = redis.call('ZSCORE', KEYS[1], ARGV[6])
    if downgraded then
        token, expiry = ARGV[6], downgraded
    end
end
if not expiry or tonumber(expiry) <= now then
    if expiry then
        drop_permit(KEYS[1], KEYS[4], KEYS[3], token)
    end
    return 0
end
if ARGV[7] ~= '' and redis.call('HGET', KEYS[4], token) ~= ARGV[7] then
    return 0
end
local until_ms = now + tonumber(ARGV[2])
if ARGV[3] == 'add' then
    local done = receipt(KEYS[5], KEYS[6], ARGV[5])
    if done then
        return tonumber(done)
    end
    until_ms = tonumber(expiry) + tonumber(ARGV[2])
    give_receipt(KEYS[5], KEYS[6], ARGV[5], until_ms - now, ARGV[4])
end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', until_ms), token)
keep_alive(KEYS[1], until_ms - now)
keep_alive(KEYS[3], until_ms - now)
keep_alive(KEYS[4], until_ms - now)
keep_alive(KEYS[2], math.max(tonumber(ARGV[4]), until_ms - now))
return until_ms - now
