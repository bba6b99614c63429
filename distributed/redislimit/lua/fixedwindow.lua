-- Fixed window aligned to the Unix epoch. KEYS[1] holds
-- "<window start> <count>". ARGV[5] = window, ARGV[6] = limit, ARGV[7] = n,
-- ARGV[8] = R mod window (where R falls in its window).
-- Returns {admitted, count after, time to the window's end}.
local W, L, n = (ARGV[5] + 0), (ARGV[6] + 0), (ARGV[7] + 0)
local pos = (ARGV[8] + 0) + now
local k = math.floor(pos / W)
local off = pos - k * W
if off < 0 then off = off + W elseif off >= W then off = off - W end
local start = now - off
local left = start + W - now
local count = 0
local v = redis.call('GET', KEYS[1])
if v then
  local s, c = string.match(v, '^(%-?%d+) (%d+)$')
  if s and rel(s) == start then count = (c + 0) end
end
if count + n > L then return {0, count, left} end
count = count + n
redis.call('SET', KEYS[1], abs(start) .. ' ' .. count, 'PX', ttl(left))
return {1, count, left}
