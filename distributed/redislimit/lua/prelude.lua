-- Shared prelude of every script (the Go side prepends it).
--
-- Lua numbers are doubles, exact only up to 2^53, while nanoseconds since
-- the Unix epoch need 61 bits. So every time inside a script is relative
-- to a reference instant R given by the caller (ARGV[2] seconds, ARGV[3]
-- nanoseconds): offsets stay far below 2^53 and the arithmetic is exact.
-- Stored instants are absolute decimal nanoseconds, converted with rel and
-- abs below, so that clients with different references share state.
--
-- ARGV[1] = '1': now is the server's TIME; '0': now is R itself (an
-- injected clock). ARGV[4] = lower bound of key TTLs in milliseconds.
-- Numbers are read with "+ 0" rather than tonumber: the same conversion
-- without a function call, which is most of its cost in Redis.
local B = 1000000000
local Rs, Rn = (ARGV[2] + 0), (ARGV[3] + 0)
local now = 0
if ARGV[1] == '1' then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = ((t[1] + 0) - Rs) * B + (t[2] + 0) * 1000 - Rn
end
local ttlfloor = (ARGV[4] + 0)

-- bad fails the script with the limiter's own error code: the key holds a
-- value no limiter wrote (the client reports it as that key's bad data;
-- every other error is the server's state).
local function bad(key, v)
  error({err = 'THROTTLE_BADVALUE ' .. key .. ' holds ' .. string.format('%q', string.sub(v or '', 1, 40))})
end

-- rel turns a stored absolute instant into an offset from R (nil stays nil).
-- An instant is stored as its decimal nanoseconds, with a minus sign before
-- 1970; the last nine digits are read apart so that every step is exact.
local function rel(v)
  if not v then return nil end
  if not string.find(v, '^%-?%d+$') then bad(KEYS[1], v) end
  local neg = string.byte(v, 1) == 45 -- '-'
  if neg then v = string.sub(v, 2) end
  local l, hi, lo = #v, 0, 0
  if l <= 9 then lo = (v + 0) else hi, lo = (string.sub(v, 1, l - 9) + 0), (string.sub(v, l - 8) + 0) end
  if neg then hi, lo = -hi, -lo end
  return (hi - Rs) * B + (lo - Rn)
end

-- abs turns an offset from R into an absolute instant to store, exactly:
-- seconds s and nanoseconds r in [0, B) (the modulo of Lua is floored, so
-- t - r is a multiple of B), written as s and r, or before 1970 as minus
-- (-s-1) and (B-r).
local function abs(x)
  local t = Rn + x
  local r = t % B
  local s = Rs + (t - r) / B
  if s >= 0 then return string.format('%d%09d', s, r) end
  if r == 0 then return string.format('-%d000000000', -s) end
  return string.format('-%d%09d', -s - 1, B - r)
end

-- ttl returns the PX of a key whose state is stale in d nanoseconds.
local function ttl(d)
  local ms = (d - d % 1000000) / 1000000 + 1
  if ms < ttlfloor then ms = ttlfloor end
  return ms
end
