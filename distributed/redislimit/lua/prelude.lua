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
local B = 1000000000
local Rs, Rn = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = 0
if ARGV[1] == '1' then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = (tonumber(t[1]) - Rs) * B + tonumber(t[2]) * 1000 - Rn
end
local ttlfloor = tonumber(ARGV[4])

-- rel turns a stored absolute instant into an offset from R (nil stays nil).
local function rel(v)
  if not v then return nil end
  local l = #v
  if l <= 9 then return tonumber(v) - Rs * B - Rn end
  return (tonumber(string.sub(v, 1, l - 9)) - Rs) * B + (tonumber(string.sub(v, l - 8)) - Rn)
end

-- abs turns an offset from R into an absolute instant to store.
local function abs(x)
  local t = Rn + x
  local c = math.floor(t / B)
  local r = t - c * B
  if r < 0 then c, r = c - 1, r + B elseif r >= B then c, r = c + 1, r - B end
  local s = Rs + c
  if s <= 0 then return string.format('%d', s * B + r) end
  return string.format('%d%09d', s, r)
end

-- ttl returns the PX of a key whose state is stale in d nanoseconds.
local function ttl(d)
  local ms = math.floor(d / 1000000) + 1
  if ms < ttlfloor then ms = ttlfloor end
  return ms
end
