-- tenure script: wake
-- Push a wake-up to a waiter's own list (the waiter's deadline came: the
-- server's BLPOP timeout is only as precise as its event loop, up to 100 ms).
-- KEYS[1] the waiter's wake list
-- ARGV[1] value to push
-- ARGV[2] time to live of the list in ms
-- returns the list's length

local n = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return n
