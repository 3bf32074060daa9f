-- tenure script: compare_and_delete
-- Delete a key only if it still holds the caller's token (a naive lock's release).
-- on resend: the key is gone: answered 0, nothing deleted (its one caller, the end
--   of an id set's compaction, ignores the answer)
-- KEYS[1] the key to delete
-- ARGV[1] the token it must hold
-- returns 1 if the key held the token and was deleted, 0 otherwise
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
