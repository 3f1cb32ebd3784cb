-- A site's acceptance, for the router and `providers --sites`.
-- returns {now ms, {field, value, ...}}: the site's hash and the clock its counts decay by
local K = {
  -- hash: the site's acceptance (see acceptance/report)
  site = KEYS[1],
}
--@include lib/now.lua
return {now, redis.call('HGETALL', K.site)}
