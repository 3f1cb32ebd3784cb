-- now: the time in ms on the Redis server's clock, never a host's (every script that needs
-- the time includes this, once).  A test may move it on by the ms stored under
-- 'captcha-tasks:test:clock-offset-ms' (keys.TEST_CLOCK_OFFSET_KEY: test-only, never set in
-- production).
local now
do
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
now = now + (tonumber(redis.call('GET', 'captcha-tasks:test:clock-offset-ms')) or 0)
