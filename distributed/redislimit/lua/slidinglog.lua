-- Sliding log. KEYS[1] is a list of "<instant> <units>" entries, oldest
-- first, one per distinct nanosecond; KEYS[2] holds "<units in the list>
-- <latest now seen>" (a clock that steps back is taken as standing still).
-- ARGV[5] = window, ARGV[6] = limit, ARGV[7] = n.
-- Returns {1, units after, window} when admitted, and
-- {0, units, retry after, reset after} when not.
local W, L, n = (ARGV[5] + 0), (ARGV[6] + 0), (ARGV[7] + 0)
local function parse(e)
  local ts, c = string.match(e, '^(%-?%d+) (%d+)$')
  if not ts then bad(KEYS[1], e) end
  return rel(ts), (c + 0), ts
end
local total = 0
local m = redis.call('GET', KEYS[2])
if m then
  local t, s = string.match(m, '^(%d+) (%-?%d+)$')
  if not t then bad(KEYS[2], m) end
  total = (t + 0)
  local seen = rel(s)
  if now < seen then now = seen end
else
  -- The summary was lost (evicted, deleted) while entries remain: count
  -- them again rather than start from zero. At most limit entries.
  for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    local ts, c = parse(e)
    total = total + c
    if now < ts then now = ts end
  end
end
while total > 0 do
  local e = redis.call('LINDEX', KEYS[1], 0)
  if not e then total = 0; break end
  local ts, c = parse(e)
  if ts > now - W then break end
  redis.call('LPOP', KEYS[1])
  total = math.max(total - c, 0)
end
local a = abs(now)
if total + n <= L then
  local last = redis.call('LINDEX', KEYS[1], -1)
  local merged = false
  if last then
    local _, c, raw = parse(last)
    if raw == a then
      redis.call('LSET', KEYS[1], -1, a .. ' ' .. (c + n))
      merged = true
    end
  end
  if not merged then redis.call('RPUSH', KEYS[1], a .. ' ' .. n) end
  total = total + n
  redis.call('SET', KEYS[2], total .. ' ' .. a, 'PX', ttl(W))
  redis.call('PEXPIRE', KEYS[1], ttl(W))
  return {1, total, W}
end
local need = total + n - L
local es = redis.call('LRANGE', KEYS[1], 0, n - 1)
local at = now
for _, e in ipairs(es) do
  local ts, c = parse(e)
  need = need - c
  at = ts
  if need <= 0 then break end
end
local newest = parse(redis.call('LINDEX', KEYS[1], -1))
redis.call('SET', KEYS[2], total .. ' ' .. a, 'KEEPTTL')
return {0, total, at + W - now, newest + W - now}
