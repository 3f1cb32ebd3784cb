-- secrets: a solve's proxy and cookies (state/secrets.py): K.secrets (hash with a TTL:
-- its stashed parameters, JSON values).
local secrets = {}

function secrets.drop()
  redis.call('DEL', K.secrets)
end
