-- The owner's live proxy (both its keys refreshed), else a free one of the candidates.
-- The caller reads the owner's assignment and the pool first, and offers the free-looking
-- members a few at a time (this script takes at most 12 keys): it calls again with the
-- next few while the answer is false.
-- A.owner, A.ttl_ms = assignment TTL, A.current = the proxy the caller read as the owner's
--   (absent: none), A.candidates = proxies to try, in the order of K.owners
-- returns {proxy, 1} when the owner keeps its live assignment, {proxy, 0} for a new
--   assignment, 'again' when the assignment is no longer what the caller read (read it
--   again), false when none of the candidates is free
local K = {
  -- the pool, its quarantine, the owner's assignment and who holds what it may get
  proxies = KEYS[1],  -- set: every proxy
  quarantine = KEYS[2],  -- zset: proxy -> when it comes back (ms)
  assignment = KEYS[3],  -- string with a TTL: the owner's proxy
  -- string with a TTL: which owner holds A.current (a key no proxy has when absent)
  current_owner = KEYS[4],
  -- strings with a TTL: which owner holds each candidate
  owners = {KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]},
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
redis.call('ZREMRANGEBYSCORE', K.quarantine, '-inf', now)
local ttl, owner = A.ttl_ms, A.owner
local function usable(proxy)
  return redis.call('SISMEMBER', K.proxies, proxy) == 1
    and not redis.call('ZSCORE', K.quarantine, proxy)
end
local current = redis.call('GET', K.assignment)
if current then
  if current ~= A.current then return 'again' end
  local held = redis.call('GET', K.current_owner) == owner
  if held and usable(current) then
    redis.call('PEXPIRE', K.assignment, ttl)
    redis.call('PEXPIRE', K.current_owner, ttl)
    return {current, 1}
  end
  -- removed, quarantined or taken over: this assignment is dead
  if held then redis.call('DEL', K.current_owner) end
  redis.call('DEL', K.assignment)
end
for i, proxy in ipairs(A.candidates) do
  if redis.call('EXISTS', K.owners[i]) == 0 and usable(proxy) then
    redis.call('SET', K.owners[i], owner, 'PX', ttl)
    redis.call('SET', K.assignment, proxy, 'PX', ttl)
    return {proxy, 0}
  end
end
return false
