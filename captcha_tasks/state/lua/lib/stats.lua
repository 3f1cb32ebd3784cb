-- stats: the deployment's counters (state/stats.py): K.solved (hash: solves of the method
-- by source), K.api_errors (hash: by code), K.lane_outcomes (hash:
-- "solved|<lane>|<tenant>" / "failed|<lane>|<tenant>" -> solves).
local stats = {}

-- A solve of the method ended with an answer from source (api, callback, pool, ...).
function stats.solved(source)
  redis.call('HINCRBY', K.solved, source, 1)
end

-- An API error answer (or a failure) by code.
function stats.error(code)
  redis.call('HINCRBY', K.api_errors, code, 1)
end

-- A solve of the lane and tenant ended ('solved' or 'failed').
function stats.lane(ending, lane, tenant)
  redis.call('HINCRBY', K.lane_outcomes, ending .. '|' .. lane .. '|' .. tenant, 1)
end
