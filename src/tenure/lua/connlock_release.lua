-- tenure script: connlock_release
-- A ConnectionLock's release: delete the booking and its owner name, only if
-- the booking still names the caller's connection.
-- on resend: the booking is gone and the owner name says "released:<the caller's
--   ID>" (kept a minute): answered 1, nothing deleted
-- KEYS[1] the booking: the holder's CLIENT ID
-- KEYS[2] the holder's owner name (same expiry as the booking)
-- ARGV[1] the caller's CLIENT ID
-- returns 1 if the booking was the caller's and was deleted (now or by this same call
--   before), 0 otherwise

local released = 'released:' .. ARGV[1]
if redis.call('GET', KEYS[1]) == ARGV[1] then
    -- the owner name becomes a receipt a resent call recognises (the next booking
    -- overwrites it)
    redis.call('SET', KEYS[2], released, 'PX', 60000)
    return redis.call('DEL', KEYS[1])
end
if redis.call('GET', KEYS[2]) == released then
    return 1 -- a resent call
end
return 0
