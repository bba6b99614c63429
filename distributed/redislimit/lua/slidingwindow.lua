-- Weighted sliding window: the estimate prev·(W-e)/W + cur of the units
-- in the last W, with windows aligned to the Unix epoch. KEYS[1] holds
-- "<window start> <prev> <cur>". ARGV[5] = W, ARGV[6] = limit, ARGV[7] = n,
-- ARGV[8] = R mod W, ARGV[9] = how many windows ahead a stored window may
-- be and still be used (a clock that stepped back).
-- Returns {admitted, prev, cur after, units used before, start - now}.

-- muldiv returns floor(a·b/c) and the remainder, exactly, for integers
-- 0 <= a < 2^24 and 0 < b, c < 2^53 with a result below 2^53: b is split
-- into quotient and remainder by c, and a·(b mod c) is reduced bit by bit
-- of a so that no intermediate value leaves the exact range of doubles.
local function muldiv(a, b, c)
  local qb = math.floor(b / c)
  local rb = b - qb * c
  local aqb = a * qb
  local q, r = 0, 0
  local bit = 8388608 -- 2^23
  while bit >= 1 do
    q = q * 2
    if r >= c - r then r = r - (c - r); q = q + 1 else r = r + r end
    if a >= bit then
      a = a - bit
      if r >= c - rb then r = r - (c - rb); q = q + 1 else r = r + rb end
    end
    bit = bit / 2
  end
  return aqb + q, r
end

local W, L, n, skew = ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0, ARGV[9] + 0
local pos = ARGV[8] + now
local off = pos - math.floor(pos / W) * W
if off < 0 then off = off + W elseif off >= W then off = off - W end
local start = now - off
local prev, cur = 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local s, p, c = string.match(v, '^(%-?%d+) (%d+) (%d+)$')
  if s then
    local s0 = rel(s)
    local d = math.floor((start - s0) / W + 0.5)
    if d == 0 then
      prev, cur = p + 0, c + 0
    elseif d == 1 then
      prev = c + 0
    elseif d < 0 and -d <= skew then
      start, prev, cur = s0, p + 0, c + 0
    end
  end
end
local e = now - start
if e < 0 then e = 0 end
local used = cur
if prev > 0 and e < W then
  local q, r = muldiv(prev, W - e, W)
  used = used + q
  if r > 0 then used = used + 1 end
end
if used + n > L then return {0, prev, cur, used, start - now} end
cur = cur + n
redis.call('SET', KEYS[1], abs(start) .. ' ' .. string.format('%d %d', prev, cur), 'PX', ttl(start + 2 * W - now))
return {1, prev, cur, used, start - now}
