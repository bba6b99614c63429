-- Token leasing on a GCRA bucket: takes up to ARGV[7] units at once for a
-- process to spend locally, but at least ARGV[8] or none.
-- ARGV[5] = interval, ARGV[6] = tau. Returns {units granted, debt after}.
local tat = rel(redis.call('GET', KEYS[1]))
local debt = 0
if tat and tat > now then debt = tat - now end
local I, tau, k, m = (ARGV[5] + 0), (ARGV[6] + 0), (ARGV[7] + 0), (ARGV[8] + 0)
local avail = math.floor((tau - debt) / I)
if avail < m then return {0, debt} end
if avail < k then k = avail end
debt = debt + k * I
redis.call('SET', KEYS[1], abs(now + debt), 'PX', ttl(debt))
return {k, debt}
