-- tenure script: ingest_release
-- Give a claimed chunk back at once (a worker that stops), so the next claim takes it
-- without waiting for its lease; its cursor stays, and the next claim resumes after it.
-- The same call made twice is answered 1 and changes nothing: the chunk's lease
-- becomes "released:<token>", which also refuses any later commit of this claim.
-- on resend: the chunk's lease reads "released:<token>"; given back by token alone,
--   the leases hash keeps "released:<token>" -> chunk (or "" when no claim was found):
--   answered as the first call, nothing changes
-- KEYS[1] free zset chunk -> lease expiry in ms (0: never claimed, or given back)
-- KEYS[2] leases hash chunk -> token (and "released:<token>" -> chunk, for a claim given
--   back by its token alone; -> "" for a token given back before its claim arrived,
--   which ingest_claim then refuses)
-- ARGV[1] the claim's token
-- ARGV[2] the chunk, or "" if unknown (a claim interrupted before its reply was read):
--   the chunk is then found among the claimed ones by its token
-- returns 1 if given back (now or by this same call before), 0 if the claim was no
--   longer this caller's (done, taken over, or the job was reset)

local chunk = ARGV[2]
local by_token = chunk == ''
if by_token then
    local released = redis.call('HGET', KEYS[2], 'released:' .. ARGV[1])
    if released then -- a resent call: answered as the first ("" - nothing was found)
        return released == '' and 0 or 1
    end
    local claimed = redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE')
    for _, candidate in ipairs(claimed) do
        if redis.call('HGET', KEYS[2], candidate) == ARGV[1] then
            chunk = candidate
            break
        end
    end
    if chunk == '' then
        -- No claim was made, or it is still on its way (sent on a connection the
        -- interruption closed): refuse it should it arrive after this.
        redis.call('HSET', KEYS[2], 'released:' .. ARGV[1], '')
        return 0
    end
end
local lease = redis.call('HGET', KEYS[2], chunk)
if lease == 'released:' .. ARGV[1] then
    return 1 -- a resent call
end
if lease ~= ARGV[1] or redis.call('ZSCORE', KEYS[1], chunk) == false then
    return 0
end
redis.call('ZADD', KEYS[1], 'XX', 0, chunk)
redis.call('HSET', KEYS[2], chunk, 'released:' .. ARGV[1])
if by_token then -- found by its token: a resent call finds it the same way
    redis.call('HSET', KEYS[2], 'released:' .. ARGV[1], chunk)
end
return 1
