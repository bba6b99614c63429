-- Fixed window aligned to the Unix epoch. KEYS[1] holds
-- "<window start> <count>". ARGV[5] = window, ARGV[6] = limit, ARGV[7] = n,
-- ARGV[8] = R mod window (where R falls in its window), ARGV[9] = skew:
-- how many windows ahead a stored window may be and still count (a clock
-- that stepped back, as in fixedwindow: the request counts in the later
-- window; further ahead, the stored window is stale).
-- Returns {admitted, count after, time to the window's end}.
local W, L, n, skew = (ARGV[5] + 0), (ARGV[6] + 0), (ARGV[7] + 0), (ARGV[9] + 0)
local pos = (ARGV[8] + 0) + now
local k = math.floor(pos / W)
local off = pos - k * W
if off < 0 then off = off + W elseif off >= W then off = off - W end
local start = now - off
local count = 0
local v = redis.call('GET', KEYS[1])
if v then
  local s, c = string.match(v, '^(%-?%d+) (%d+)$')
  if s then
    local s0 = rel(s)
    if s0 == start then
      count = (c + 0)
    elseif s0 > start and s0 - start <= skew * W then
      start, count = s0, (c + 0)
    end
  end
end
local left = start + W - now
if count + n > L then return {0, count, left} end
count = count + n
redis.call('SET', KEYS[1], abs(start) .. ' ' .. count, 'PX', ttl(left))
return {1, count, left}
