-- tenure script: market_purchase
-- The demo marketplace's purchase (Redis in Action 4.4.3) in one atomic step.
-- on resend: the listing is gone and the item is in the buyer's inventory: answered
--   1, nothing paid again
-- KEYS[1] the market (a sorted set of "item.seller" scored by price)
-- KEYS[2] the buyer's hash (field "funds")
-- KEYS[3] the seller's hash (field "funds")
-- KEYS[4] the buyer's inventory (a set of item ids)
-- ARGV[1] the item id
-- ARGV[2] the seller's id
-- returns 1 if bought, 0 if the item is no longer listed, -1 if the buyer cannot pay
local listing = ARGV[1] .. '.' .. ARGV[2]
local price = redis.call('ZSCORE', KEYS[1], listing)
if not price then
    if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 1 then
        return 1 -- a resent call: the item was bought already
    end
    return 0
end
price = tonumber(price)
if price > tonumber(redis.call('HGET', KEYS[2], 'funds') or '0') then
    return -1
end
redis.call('HINCRBY', KEYS[3], 'funds', price)
redis.call('HINCRBY', KEYS[2], 'funds', -price)
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[1], listing)
return 1
