-- tenure script: stream_dead_letter
-- Move a message that was delivered too often to the dead-letter stream, and ack it.
-- KEYS[1] the stream
-- KEYS[2] the dead-letter stream
-- ARGV[1] the consumer group
-- ARGV[2] the message id
-- ARGV[3] how many times it was delivered
-- returns 1 if moved, 0 if the message is gone from the stream (it is acked anyway)

local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if #found == 0 then
    return 0
end
local fields = found[1][2]
fields[#fields + 1] = 'tenure-id'
fields[#fields + 1] = ARGV[2]
fields[#fields + 1] = 'tenure-deliveries'
fields[#fields + 1] = ARGV[3]
fields[#fields + 1] = 'tenure-group'
fields[#fields + 1] = ARGV[1]
redis.call('XADD', KEYS[2], '*', unpack(fields))
return 1
