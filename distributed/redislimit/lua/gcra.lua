-- GCRA (token bucket, leaky bucket meter). KEYS[1] holds the theoretical
-- arrival time (TAT). ARGV[5] = cost of the request (n * interval),
-- ARGV[6] = admission limit (tau, plus maxWait for a reservation),
-- ARGV[7] = '1' to return the new TAT (a reservation that may be refunded).
-- Returns {1, debt after[, TAT]} when admitted, {0, debt} when not, where
-- debt = max(TAT - now, 0).
local tat = rel(redis.call('GET', KEYS[1]))
local debt = 0
if tat and tat > now then debt = tat - now end
local cost, lim = tonumber(ARGV[5]), tonumber(ARGV[6])
if debt + cost > lim then return {0, debt} end
debt = debt + cost
local v = abs(now + debt)
redis.call('SET', KEYS[1], v, 'PX', ttl(debt))
if ARGV[7] == '1' then return {1, debt, v} end
return {1, debt}
