-- Where a site's submit goes: counts a submit sent elsewhere than the configured order's
-- first provider by its reason, and records the site's route when it changed, so that one
-- process (the one this call answers 1) says so (an exploring submit is no route).  A site
-- no report counted, or one routed in order that never went elsewhere, records nothing.
-- A.route = the provider, A.why = the reason (core.acceptance.REASONS)
-- returns 1 when this call changed the site's route, else 0
local K = {
  -- hash: the site's acceptance (see acceptance/report)
  site = KEYS[1],
  -- hash: submits sent elsewhere than in order, by reason (metrics)
  reroutes = KEYS[2],
}
local A = cjson.decode(ARGV[1])
if A.why ~= 'order' then redis.call('HINCRBY', K.reroutes, A.why, 1) end
if A.why == 'explore' then return 0 end
if redis.call('EXISTS', K.site) == 0 then return 0 end
local was = redis.call('HGET', K.site, 'route')
if was == A.route then return 0 end
if not was and A.why == 'order' then return 0 end
redis.call('HSET', K.site, 'route', A.route, 'why', A.why)
return 1
