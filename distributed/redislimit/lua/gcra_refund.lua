-- Gives back a GCRA booking if nothing was booked since: KEYS[1] still
-- holds ARGV[5], the TAT the booking left; it moves back by ARGV[6].
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[5] then return {0} end
redis.call('SET', KEYS[1], abs(rel(v) - (ARGV[6] + 0)), 'KEEPTTL')
return {1}
