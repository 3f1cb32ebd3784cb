-- A report on a token: counts it for the provider that solved it, for the method at the
-- site, with the counts so far decayed to now (each halves every half-life), and keeps the
-- site among the most reported: a site new to a full table takes the place of the least
-- reported one, and starts from its count (so a new site can climb past it).
-- A.provider = the provider that solved it, A.method, A.good = true | false, A.score = the v3 score
--   the site returned (absent: none), A.half_life_ms, A.sites = how many sites are kept
-- returns the number of sites trimmed to make room
local K = {
  -- hash: the site's acceptance (<provider>:good, :bad, :score_sum, :scores, :at; route, why)
  site = KEYS[1],
  -- sorted set: the names of the sites' hashes, score = reports
  sites = KEYS[2],
  -- hash: reports ever counted, '<provider>|<method>|good' or '|bad' -> count (metrics)
  counts = KEYS[3],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local p = A.provider .. ':'
local was = redis.call('HMGET', K.site, p .. 'good', p .. 'bad', p .. 'score_sum',
  p .. 'scores', p .. 'at')
local at = tonumber(was[5]) or now
local factor = 1
if now > at then factor = 0.5 ^ ((now - at) / A.half_life_ms) end
local good = (tonumber(was[1]) or 0) * factor
local bad = (tonumber(was[2]) or 0) * factor
local score_sum = (tonumber(was[3]) or 0) * factor
local scores = (tonumber(was[4]) or 0) * factor
local verdict = 'bad'
if A.good then good, verdict = good + 1, 'good' else bad = bad + 1 end
redis.call('HINCRBY', K.counts, A.provider .. '|' .. A.method .. '|' .. verdict, 1)
if type(A.score) == 'number' then
  score_sum = score_sum + A.score
  scores = scores + 1
end
redis.call('HSET', K.site, p .. 'good', tostring(good), p .. 'bad', tostring(bad),
  p .. 'score_sum', tostring(score_sum), p .. 'scores', tostring(scores), p .. 'at', now)
local trimmed = 0
if not redis.call('ZSCORE', K.sites, K.site) then
  local floor = 0
  while redis.call('ZCARD', K.sites) >= A.sites do
    local least = redis.call('ZPOPMIN', K.sites)
    floor = tonumber(least[2])
    -- a member is the name of a site's hash (keys.acceptance built it): the site goes
    redis.call('DEL', least[1])
    trimmed = trimmed + 1
  end
  redis.call('ZADD', K.sites, floor, K.site)
end
redis.call('ZINCRBY', K.sites, 1, K.site)
return trimmed
