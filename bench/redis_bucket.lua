-- The token bucket contract as one Redis script: KEYS[1] the bucket; ARGV burst,
-- refill_per_minute, cost. Returns {admitted, remaining, retry_after_ms}.
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 60000.0
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local state = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(state[1])
local at = tonumber(state[2])
if level == nil then
  level, at = burst, now
else
  level = math.min(burst, level + math.max(0, now - at) * rate)
  at = math.max(at, now)
end
if level >= cost then
  level = level - cost
  redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', at)
  redis.call('PEXPIRE', KEYS[1], math.ceil((burst - level) / rate) + 1000)
  return {1, math.floor(level), 0}
end
return {0, math.floor(level), math.ceil((cost - level) / rate)}
