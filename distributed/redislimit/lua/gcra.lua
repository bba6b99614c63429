-- GCRA (token bucket, leaky bucket meter). KEYS[1] holds the theoretical
-- arrival time (TAT). ARGV[5] = cost of the request (n * interval),
-- ARGV[6] = admission limit (tau, plus maxWait for a reservation),
-- ARGV[7] = '1' to return the new TAT (a reservation that may be refunded).
-- Returns, with debt = max(TAT - now, 0): the debt after admission, or
-- -1 - debt when not admitted (one integer: no table to build or parse);
-- with ARGV[7] = '1', {1, debt after, TAT} or {0, debt}.
local tat = rel(redis.call('GET', KEYS[1]))
local debt = 0
if tat and tat > now then debt = tat - now end
local cost, lim = (ARGV[5] + 0), (ARGV[6] + 0)
if debt + cost > lim then
  if ARGV[7] == '1' then return {0, debt} end
  return -1 - debt
end
debt = debt + cost
local v = abs(now + debt)
redis.call('SET', KEYS[1], v, 'PX', ttl(debt))
if ARGV[7] == '1' then return {1, debt, v} end
return debt
