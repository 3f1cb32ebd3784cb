-- Budget for res.php requests: at most per_captcha * captchas + base per hour.
-- A.per_captcha = requests allowed per captcha submitted (-1: no budget, only an HTTP 429
--   holds them), A.base = base allowance, A.n = requests this call makes
-- returns 0 when the requests may go now (they are counted), else ms to wait (an HTTP
--   429's Retry-After holds every request of the account)
local K = {
  -- the provider's requests per hour and its HTTP 429 hold (lib/rates.lua)
  rate_hourly = KEYS[1],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/rates.lua
local pause = rates.paused()
if pause > 0 then return pause end
if A.per_captcha < 0 then return 0 end
local hour = math.floor(now / rates.HOUR_MS)
local sent = tonumber(redis.call('HGET', K.rate_hourly, 'res:' .. hour) or '0')
local made = tonumber(redis.call('HGET', K.rate_hourly, 'in:' .. hour) or '0')
if sent + A.n <= A.per_captcha * made + A.base then
  redis.call('HINCRBY', K.rate_hourly, 'res:' .. hour, A.n)
  redis.call('PEXPIRE', K.rate_hourly, 3 * rates.HOUR_MS)
  return 0
end
return (hour + 1) * rates.HOUR_MS - now
