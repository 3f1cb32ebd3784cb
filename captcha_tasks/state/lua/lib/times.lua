-- times: observed solve times (state/timing.py): K.solve_times (list: a method's recent
-- solve times, newest first).
local times = {}

-- Samples kept per method (timing.SAMPLE_WINDOW).
times.WINDOW = 200

function times.add(seconds)
  redis.call('LPUSH', K.solve_times, seconds)
  redis.call('LTRIM', K.solve_times, 0, times.WINDOW - 1)
end
