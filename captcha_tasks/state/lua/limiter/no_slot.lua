-- The provider answered in.php with NO_SLOT: count it against its NO_SLOT budget.
-- A (nothing)
-- returns 1
local K = {
  -- the provider's requests per hour (lib/rates.lua)
  rate_hourly = KEYS[1],
}
--@include lib/now.lua
--@include lib/rates.lua
local hour = math.floor(now / rates.HOUR_MS)
redis.call('HINCRBY', K.rate_hourly, 'noslot:' .. hour, 1)
redis.call('PEXPIRE', K.rate_hourly, 3 * rates.HOUR_MS)
return 1
