-- budget: tenants' daily budgets (state/budgets.py), account-wide: K.budget (hash:
-- "<UTC day number>|<tenant>" -> captchas submitted that day).  daily is the tenant's
-- budget (nil: none).
--@include lib/now.lua
local budget = {}

-- ms in a day (budgets.DAY_MS): the day is the Redis server's UTC day.
budget.DAY_MS = 86400000

function budget.field(tenant, day_offset)
  return tostring(math.floor(now / budget.DAY_MS) + (day_offset or 0)) .. '|' .. tenant
end

-- True when the tenant spent its budget today.
function budget.spent(tenant, daily)
  if not daily then return false end
  return tonumber(redis.call('HGET', K.budget, budget.field(tenant)) or '0') >= daily
end

-- Count one captcha of the tenant today: false (nothing counted) when its budget is spent.
function budget.charge(tenant, daily)
  if budget.spent(tenant, daily) then return false end
  redis.call('HINCRBY', K.budget, budget.field(tenant), 1)
  redis.call('HDEL', K.budget, budget.field(tenant, -2))
  return true
end
