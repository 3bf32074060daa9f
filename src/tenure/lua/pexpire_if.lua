-- tenure script: pexpire_if
-- Reset a key's time to live only if it still holds the caller's value.
-- on resend: the key still holds the value: the same time to live set again
-- KEYS[1] the key
-- ARGV[1] the value it must hold
-- ARGV[2] the new time to live in ms
-- returns 1 if reset, 0 if the key is gone or holds another value

if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
