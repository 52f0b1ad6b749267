package redisstore

import "github.com/redis/go-redis/v9"

// The record of one identity is one Redis hash, KEYS[1] of every script,
// so each script touches one key (one hash slot on Redis Cluster) and runs
// atomically. Its fields:
//
//	state    "1" in progress, "2" completed, "3" indeterminate
//	token    the fencing token, decimal (compared as a string: a Lua number
//	         is a double and would round a large token)
//	attempt  claims of the record, decimal
//	lease    LeaseUntil in Unix microseconds; absent when zero
//	expires  ExpiresAt in Unix microseconds
//	created  CreatedAt in Unix microseconds
//	fp       the fingerprint; absent when none
//	status   the recorded status; absent while in progress
//	resp     the recorded response, byte for byte; absent when empty
//	done     the nonce of the Complete call that completed the record
//	caller, scope, key  the debug copies
//
// Times are microseconds below 2^53, which a Lua number holds exactly.
// The key's own expiry (PEXPIRE, counted by the server's clock) is the
// record's retention: ExpiresAt minus the caller's Now at the claim, plus
// keyGrace, and moved by as much as ExpiresAt moves afterwards.

// claimScript: ARGV now, token, lease ("" for zero), expires, ttl (ms),
// takeover ("1" or "0"), fingerprint, caller, scope, key. It returns
// {outcome, HGETALL}: outcome 1 claimed, 0 not claimed (the record as it
// is), 2 the record is already this token's claim (a resent claim whose
// first answer was lost).
var claimScript = redis.NewScript(`
local k = KEYS[1]
local now = tonumber(ARGV[1])
local cur = redis.call('HMGET', k, 'state', 'expires', 'lease', 'token')
if cur[1] and tonumber(cur[2]) > now then
	if cur[1] == '1' and cur[4] == ARGV[2] then
		return {2, redis.call('HGETALL', k)}
	end
	if not (ARGV[6] == '1' and cur[1] == '1' and cur[3] and tonumber(cur[3]) <= now) then
		return {0, redis.call('HGETALL', k)}
	end
	redis.call('HSET', k, 'token', ARGV[2], 'lease', ARGV[3], 'expires', ARGV[4])
	if ARGV[3] == '' then redis.call('HDEL', k, 'lease') end
	redis.call('HINCRBY', k, 'attempt', 1)
	if ARGV[7] == '' then
		redis.call('HDEL', k, 'fp')
	else
		redis.call('HSET', k, 'fp', ARGV[7])
	end
	redis.call('PEXPIRE', k, ARGV[5])
	return {1, redis.call('HGETALL', k)}
end
redis.call('DEL', k)
redis.call('HSET', k, 'state', '1', 'token', ARGV[2], 'attempt', '1', 'expires', ARGV[4],
	'created', ARGV[1], 'caller', ARGV[8], 'scope', ARGV[9], 'key', ARGV[10])
if ARGV[3] ~= '' then redis.call('HSET', k, 'lease', ARGV[3]) end
if ARGV[7] ~= '' then redis.call('HSET', k, 'fp', ARGV[7]) end
redis.call('PEXPIRE', k, ARGV[5])
return {1, redis.call('HGETALL', k)}
`)

// moveExpiry (in every script that changes ExpiresAt) moves the key's
// expiry by as much as ExpiresAt moves: from old to new (microseconds).
// A key without an expiry (PTTL -1: someone removed it) keeps none.
const moveExpiry = `
local function moveExpiry(k, old, new)
	local ttl = redis.call('PTTL', k)
	if ttl >= 0 then
		redis.call('PEXPIRE', k, string.format('%d', ttl + math.floor((new - old) / 1000)))
	end
end
`

// extendScript: ARGV token, lease. 1 extended, 0 fenced.
var extendScript = redis.NewScript(moveExpiry + `
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'state', 'token', 'expires')
if cur[1] ~= '1' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', k, 'lease', ARGV[2])
local old, new = tonumber(cur[3]), tonumber(ARGV[2])
if new > old then
	redis.call('HSET', k, 'expires', ARGV[2])
	moveExpiry(k, old, new)
end
return 1
`)

// completeScript: ARGV token, state, status, response, expires, nonce.
// 1 completed, 0 fenced. A completed record whose done field is this
// call's nonce was completed by this very call (a resent script whose
// first answer was lost): 1 again.
var completeScript = redis.NewScript(moveExpiry + `
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'state', 'token', 'expires', 'done')
if not cur[1] or cur[2] ~= ARGV[1] then return 0 end
if cur[1] == '2' then
	if cur[4] == ARGV[6] then return 1 end
	return 0
end
redis.call('HSET', k, 'state', ARGV[2], 'status', ARGV[3], 'expires', ARGV[5], 'done', ARGV[6])
redis.call('HDEL', k, 'lease')
if ARGV[4] == '' then
	redis.call('HDEL', k, 'resp')
else
	redis.call('HSET', k, 'resp', ARGV[4])
end
moveExpiry(k, tonumber(cur[3]), tonumber(ARGV[5]))
return 1
`)

// releaseScript: ARGV token. 1 released (or missing), 0 fenced.
var releaseScript = redis.NewScript(`
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'state', 'token')
if not cur[1] then return 1 end
if cur[2] ~= ARGV[1] or cur[1] == '2' then return 0 end
redis.call('DEL', k)
return 1
`)

// sweepScript: ARGV now. 1 when it deleted the record because it had
// expired (ExpiresAt <= now), else 0.
var sweepScript = redis.NewScript(`
local e = redis.call('HGET', KEYS[1], 'expires')
if e and tonumber(e) <= tonumber(ARGV[1]) then
	redis.call('DEL', KEYS[1])
	return 1
end
return 0
`)
