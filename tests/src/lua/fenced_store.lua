-- A toy downstream store that checks fencing tokens.
-- KEYS[1] data, KEYS[2] highest token seen, KEYS[3] rejected-writes counter
-- ARGV[1] the writer's fencing token, ARGV[2] the value
-- Accepts a write only if its token is at least the highest seen; replies 1 (accepted) or 0.
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
