-- tenure script: connlock_refresh
-- Reset a ConnectionLock's opt-in lease, and its owner name's, only if the
-- booking still names the caller's connection.
-- on resend: the booking still names the caller's ID: the same lease set again
-- KEYS[1] the booking: the holder's CLIENT ID
-- KEYS[2] the holder's owner name
-- ARGV[1] the caller's CLIENT ID
-- ARGV[2] the new time to live in ms
-- returns 1 if reset, 0 if the booking is gone or names another connection

if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
