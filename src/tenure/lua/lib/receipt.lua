-- Receipts: how a resent call is recognised (included, not run on its own).
-- A client library resends a command whose reply it lost (redis-py's default
-- Retry does), and the first run may have happened. Most calls recognise
-- themselves from the state they left (the caller's token holds, its place
-- in line is kept). The calls that cannot -- a release (the hold is gone, and
-- "gone" also means "its lease ran out"), a lease extended *by* an amount, a
-- changed limit -- leave a receipt, and a call that finds its own receipt
-- answers what the first run answered and changes nothing.
--   done      hash call id -> the reply its first run gave
--   done_old  the generation before: `done` becomes it at RECEIPT_CAP entries,
--             so a receipt outlives at least RECEIPT_CAP later calls, and both
--             expire receipt_ms after their last write.
-- A call id is the caller's token for a call that ends a hold (each
-- acquisition has its own), else a fresh random id per call.

local RECEIPT_CAP = 1000

-- The reply a call with this id gave already (false: none on record).
local function receipt(done, done_old, id)
    return redis.call('HGET', done, id) or redis.call('HGET', done_old, id)
end

-- Keep the reply a call with this id gave, for receipt_ms.
local function give_receipt(done, done_old, id, reply, receipt_ms)
    if redis.call('HLEN', done) >= RECEIPT_CAP then
        redis.call('RENAME', done, done_old)
    end
    redis.call('HSET', done, id, reply)
    redis.call('PEXPIRE', done, receipt_ms)
end

-- A release's receipt is kept per acquisition: its token and its fence (two
-- owners that chose one token release different acquisitions), and per token
-- alone for a caller that knows no fence (a hold taken over by its token).
-- The reply a release of token (with the fence the caller knows, or '') gave.
local function release_receipt(done, done_old, token, mine)
    if mine ~= '' then
        return receipt(done, done_old, token .. ':' .. mine)
    end
    return receipt(done, done_old, token)
end

-- Keep the receipt of a release of token's acquisition with fence `fence`.
local function give_release_receipt(done, done_old, token, fence, mine, receipt_ms)
    give_receipt(done, done_old, token .. ':' .. (fence or ''), 1, receipt_ms)
    if mine == '' then
        give_receipt(done, done_old, token, 1, receipt_ms)
    end
end
