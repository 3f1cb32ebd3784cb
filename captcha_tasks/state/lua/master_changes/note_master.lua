-- Remember the master's address and run id; count a change of run id.
-- A.run_id = the master's run id now, A.address = where it is (host:port)
-- returns 0 the first time or for the same run id, 1 for a new run id at another address
--   (another master), 2 for a new run id at the same address (the server restarted)
local K = {
  -- string: '<address> <run id>' last seen (a bare run id before addresses were kept)
  master = KEYS[1],
  events = KEYS[2],  -- hash: counters
}
local A = cjson.decode(ARGV[1])
local seen = redis.call('GET', K.master)
local current = A.address .. ' ' .. A.run_id
local at, run_id = string.match(seen or '', '^(%S+) (%S+)$')
if seen == A.run_id or run_id == A.run_id then
  if seen ~= current then redis.call('SET', K.master, current) end
  return 0
end
redis.call('SET', K.master, current)
if not seen then return 0 end
redis.call('HINCRBY', K.events, 'master_changes', 1)
if at == A.address then return 2 end
return 1
