-- tenure script: stream_claim
-- Take over messages whose consumer went quiet (XAUTOCLAIM from a cursor), with the
-- delivery count each has now; a message delivered more than the limit goes to the
-- dead-letter stream instead (with its id, deliveries and group) and is acknowledged.
-- on resend: KEYS[3] records this call's id (ARGV[7]) with the ids it claimed and its
--   figures for a minute: the same messages are answered, nothing claimed again
-- KEYS[1] the stream
-- KEYS[2] the dead-letter stream
-- KEYS[3] the consumer's claim record: "<call id> <next cursor> <dead-lettered> <id>..."
--   of its last claim that took or dead-lettered anything (kept a minute)
-- ARGV[1] the consumer group
-- ARGV[2] the consumer taking them over
-- ARGV[3] idle time in ms after which a message is taken over
-- ARGV[4] the scan's cursor ("0-0" to start)
-- ARGV[5] how many messages at most
-- ARGV[6] the most deliveries a message may have
-- ARGV[7] this call's id (fresh per call)
-- returns {next cursor, {{id, {field, value, ...}, deliveries}, ...}, messages dead-lettered}

local record = redis.call('GET', KEYS[3])
if record then
    local parts = {}
    for part in string.gmatch(record, '%S+') do
        parts[#parts + 1] = part
    end
    if parts[1] == ARGV[7] then -- a resent call: the messages its first run took
        local again = {}
        for i = 4, #parts do
            local found = redis.call('XRANGE', KEYS[1], parts[i], parts[i])
            if #found > 0 then
                local pending = redis.call('XPENDING', KEYS[1], ARGV[1], parts[i], parts[i], 1)
                local deliveries = 0
                if #pending > 0 then
                    deliveries = pending[1][4]
                end
                again[#again + 1] = {parts[i], found[1][2], deliveries}
            end
        end
        return {parts[2], again, tonumber(parts[3])}
    end
end
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
if #claimed > 0 or dead > 0 then
    local ids = {}
    for i, message in ipairs(claimed) do
        ids[i] = message[1]
    end
    redis.call('SET', KEYS[3], ARGV[7] .. ' ' .. reply[1] .. ' ' .. dead .. ' '
        .. table.concat(ids, ' '), 'PX', 60000)
end
return {reply[1], claimed, dead}
