-- tenure script: ingest_plan
-- Freeze a job's plan, or check that the plan given is the one frozen.
-- on resend: the same plan is found frozen ({2}); the caller reads it back, as the
--   first run left it
-- KEYS[1] plan hash {fingerprint, plan, chunks, sink}
-- KEYS[2] free zset chunk -> lease expiry in ms (0: never claimed, or given back)
-- ARGV[1] the plan's fingerprint
-- ARGV[2] the plan, JSON
-- ARGV[3] how many chunks it makes
-- ARGV[4] the sink of the run that freezes it ("stream:KEY" or "list:KEY")
-- returns {1} if frozen now, {2} if the same plan was frozen before,
--   {0, fingerprint, plan} if another plan holds the name

local stored = redis.call('HGET', KEYS[1], 'fingerprint')
if stored then
    if stored == ARGV[1] then
        return {2}
    end
    return {0, stored, redis.call('HGET', KEYS[1], 'plan')}
end
local chunks = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'plan', ARGV[2], 'chunks', chunks,
    'sink', ARGV[4])
local batch = {}
for chunk = 0, chunks - 1 do
    batch[#batch + 1] = 0
    batch[#batch + 1] = chunk
    if #batch >= 2000 then
        redis.call('ZADD', KEYS[2], unpack(batch))
        batch = {}
    end
end
if #batch > 0 then
    redis.call('ZADD', KEYS[2], unpack(batch))
end
return {1}
