-- Extends the leases of the members ARGV[6..] of KEYS[1] that are still
-- held (lease not run out) to now + ARGV[5]; with ARGV[5] = '-' removes
-- them instead. Returns {how many members were still held, those members}.
local function us(x)
  local t = Rn + x
  return Rs * 1000000 + math.floor(t / 1000)
end
local nowus = us(now)
local found = 0
local alive = {0}
local lease = ARGV[5]
local exp = 0
if lease ~= '-' then
  lease = (lease + 0)
  exp = us(now + lease)
end
for i = 6, #ARGV do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and (s + 0) > nowus then
    found = found + 1
    alive[#alive + 1] = ARGV[i]
    if lease == '-' then
      redis.call('ZREM', KEYS[1], ARGV[i])
    else
      redis.call('ZADD', KEYS[1], exp, ARGV[i])
    end
  elseif s then
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
if found > 0 and lease ~= '-' then redis.call('PEXPIRE', KEYS[1], ttl(lease)) end
alive[1] = found
return alive
