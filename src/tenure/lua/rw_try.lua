-- tenure script: rw_try
-- The fast path of a read or write acquire: hold now if nobody waits and the
-- current holders allow it (readers share; a writer is alone).
-- KEYS[1] holders zset: token ("r..." or "w...") -> lease expiry (ms, server clock)
-- KEYS[2] queue zset (only its existence is checked)
-- KEYS[3] fencing counter (never expires)
-- ARGV[1] token; its first letter is the mode
-- ARGV[2] lease in ms
-- returns the fencing token (> 0) if taken, else 0

--! include lock
--! include semaphore
--! include rw
local now = server_time()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
if redis.call('EXISTS', KEYS[2]) == 1 or not admissible(KEYS[1], ARGV[1]) then
    return 0
end
local fence = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
keep_alive(KEYS[1], ARGV[2])
return fence
