-- tenure script: stream_touch
-- Keep the messages of a batch claimed by their consumer while it works on them
-- (reset their idle time), those it still holds.
-- on resend: the consumer still holds the same messages: their idle time reset again
-- KEYS[1] the stream
-- ARGV[1] the consumer group
-- ARGV[2] the consumer
-- ARGV[3...] the message ids
-- returns how many of them the consumer still held (acknowledged ones, and those
--         another consumer took, are left alone)

local held = {}
for i = 3, #ARGV do
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
    if #pending > 0 and pending[1][2] == ARGV[2] then
        held[#held + 1] = ARGV[i]
    end
end
-- (in slices: a batch may be larger than Lua's unpack takes at once)
for first = 1, #held, 1000 do
    local call = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
    for i = first, math.min(first + 999, #held) do
        call[#call + 1] = held[i]
    end
    call[#call + 1] = 'JUSTID'
    redis.call(unpack(call))
end
return #held
