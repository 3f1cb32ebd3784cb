-- batch: batch result streams (state/batches.py): K.batch_stream (stream of one batch's
-- outcomes), K.batch_cancelled (string: the caller abandoned the batch; nothing more is
-- appended).
local batch = {}

-- Seconds a batch stream is kept after its last entry (batches.STREAM_TTL).
batch.STREAM_TTL_S = 86400

function batch.append(entry)
  if redis.call('EXISTS', K.batch_cancelled) == 1 then return end
  redis.call('XADD', K.batch_stream, '*', 'outcome', entry)
  redis.call('EXPIRE', K.batch_stream, batch.STREAM_TTL_S)
end
