-- tenure script: market_list
-- The demo marketplace's listing (Redis in Action 4.4.2) in one atomic step.
-- on resend: the item is gone from the inventory and listed by this seller at this
--   price: answered 1, nothing moves
-- KEYS[1] the seller's inventory (a set of item ids)
-- KEYS[2] the market (a sorted set of "item.seller" scored by price)
-- ARGV[1] the item id
-- ARGV[2] the seller's id
-- ARGV[3] the price
-- returns 1 if the item moved to the market, 0 if the seller did not have it
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then
    local listed = redis.call('ZSCORE', KEYS[2], ARGV[1] .. '.' .. ARGV[2])
    if listed and tonumber(listed) == tonumber(ARGV[3]) then
        return 1 -- a resent call: the item is listed at this price already
    end
    return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1] .. '.' .. ARGV[2])
return 1
