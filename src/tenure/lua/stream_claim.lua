-- tenure script: stream_claim
-- Take over messages whose consumer went quiet (XAUTOCLAIM from a cursor), with the
-- delivery count each has now; a message delivered more than the limit goes to the
-- dead-letter stream instead (with its id, deliveries and group) and is acknowledged.
-- KEYS[1] the stream
-- KEYS[2] the dead-letter stream
-- ARGV[1] the consumer group
-- ARGV[2] the consumer taking them over
-- ARGV[3] idle time in ms after which a message is taken over
-- ARGV[4] the scan's cursor ("0-0" to start)
-- ARGV[5] how many messages at most
-- ARGV[6] the most deliveries a message may have
-- returns {next cursor, {{id, {field, value, ...}, deliveries}, ...}, messages dead-lettered}

local reply = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4],
    'COUNT', ARGV[5])
local claimed = {}
local dead = 0
for _, entry in ipairs(reply[2]) do
    if entry then -- (6.2 answers nil for an entry deleted from the stream)
        local id = entry[1]
        local pending = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
        local deliveries = pending[1][4]
        if deliveries > tonumber(ARGV[6]) then
            local fields = entry[2]
            fields[#fields + 1] = 'tenure-id'
            fields[#fields + 1] = id
            fields[#fields + 1] = 'tenure-deliveries'
            fields[#fields + 1] = tostring(deliveries)
            fields[#fields + 1] = 'tenure-group'
            fields[#fields + 1] = ARGV[1]
            redis.call('XADD', KEYS[2], '*', unpack(fields))
            redis.call('XACK', KEYS[1], ARGV[1], id)
            dead = dead + 1
        else
            claimed[#claimed + 1] = {id, entry[2], deliveries}
        end
    end
end
return {reply[1], claimed, dead}
