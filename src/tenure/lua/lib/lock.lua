-- Shared by the lock scripts (included after lib/queue, not run on its own).
-- Key layout of one lock, all under one {hash tag} so a cluster keeps them in one slot:
--   owner   hash {token, fence, count}; its PEXPIRE is the lease; count (re-entries
--           beyond the first) is absent until the owner re-enters
--   queue, waiters   the FIFO queue (lib/queue)
--   fence   counter, never expires: the fencing token of each acquisition
--   owner .. ':wake:' .. token   list a waiter blocks on (BLPOP); derived from the
--           owner key, so it shares the hash tag and the slot.

-- Make `token` the owner for `lease_ms`; return its fencing token. The hash
-- may still hold the previous owner (a handoff): its fields are overwritten.
local function take(owner, fence, token, lease_ms)
    local f = redis.call('INCR', fence)
    redis.call('HSET', owner, 'token', token, 'fence', f)
    redis.call('PEXPIRE', owner, lease_ms)
    return f
end

-- Hand the (free) lock to the first live waiter, inside this script, so no
-- newcomer can barge in; wake exactly that waiter. The handed-over lease is
-- short (handoff_ms) until the new owner confirms it with its full lease, so
-- a waiter that died just before its turn delays the others by at most that.
local function grant_next(owner, queue, waiters, fence, handoff_ms, now)
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
        return false
    end
    leave_queue(queue, waiters, head)
    local f = take(owner, fence, head, handoff_ms)
    wake_waiter(owner .. ':wake:' .. head, f, handoff_ms, now)
    return head
end
