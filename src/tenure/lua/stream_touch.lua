-- tenure script: stream_touch
-- Keep a message claimed by its consumer while it works (reset its idle time).
-- on resend: the consumer still holds the message: its idle time reset again
-- KEYS[1] the stream
-- ARGV[1] the consumer group
-- ARGV[2] the consumer
-- ARGV[3] the message id
-- returns 1 if the consumer still held the message, 0 if another consumer took it

local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #pending == 0 or pending[1][2] ~= ARGV[2] then
    return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
