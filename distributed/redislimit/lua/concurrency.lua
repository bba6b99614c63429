-- Concurrency slots with leases. KEYS[1] is a sorted set of held units:
-- one member per unit ("<holder id>:<seq>"), scored by the expiry of its
-- lease in microseconds since the Unix epoch, so that units of a crashed
-- holder come back when their lease runs out.
-- ARGV[5] = limit, ARGV[6] = n, ARGV[7] = lease, ARGV[8] = holder id,
-- ARGV[9] = first sequence number. Returns {admitted, units held after}.
local function us(x)
  local t = Rn + x
  return Rs * 1000000 + math.floor(t / 1000)
end
local L, n, lease = (ARGV[5] + 0), (ARGV[6] + 0), (ARGV[7] + 0)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', us(now))
local cur = redis.call('ZCARD', KEYS[1])
if cur + n > L then return {0, cur} end
local exp = us(now + lease)
local seq = (ARGV[9] + 0)
for i = 0, n - 1 do
  redis.call('ZADD', KEYS[1], exp, ARGV[8] .. ':' .. string.format('%d', seq + i))
end
redis.call('PEXPIRE', KEYS[1], ttl(lease))
return {1, cur + n}
