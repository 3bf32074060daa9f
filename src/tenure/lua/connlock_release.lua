-- tenure script: connlock_release
-- A ConnectionLock's release: delete the booking and its owner name, only if
-- the booking still names the caller's connection.
-- KEYS[1] the booking: the holder's CLIENT ID
-- KEYS[2] the holder's owner name (same expiry as the booking)
-- ARGV[1] the caller's CLIENT ID
-- returns 1 if the booking was the caller's and was deleted, 0 otherwise

if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
    return redis.call('DEL', KEYS[1])
end
return 0
