"""The Lua scripts that keep the cluster's shared state consistent under concurrent gateways and nodes.

Each runs atomically in Redis, with Redis's own clock (``TIME``), so no two hosts' clocks are compared.

Keys of node N (prefix ``P``): ``P node:N`` (hash: ``info`` JSON, ``max``, ``active``, ``draining``),
``P node:N:alive`` (the heartbeat, with a TTL), ``P node:N:roster`` (sandbox id -> state), ``P node:N:resv``
(reservation token -> expiry, ms), ``P node:N:resv-sid`` (token -> ``sandbox|committed_ms``) and
``P node:N:drain`` (set by an admin: place nothing new there), ``P node:N:bound`` (sandbox id -> when last
seen bound there: bindings not in the roster for longer than a grace are removed); and
``P nodes`` (every node id ever seen), ``P bindings`` (sandbox id -> node id) and ``P template-nodes``
(template id or name -> the node a build through a gateway made it on; ``UNBIND`` also clears its entries).
"""

from __future__ import annotations

NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

HEARTBEAT = (
    NOW
    + """
-- KEYS: nodes, node, alive, roster, resv, resv-sid, bindings, bound
-- ARGV: node_id, ttl_ms, info, max, active, draining, grace_ms, then sandbox id / state pairs
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'info', ARGV[3], 'max', ARGV[4], 'active', ARGV[5], 'draining', ARGV[6])
redis.call('SET', KEYS[3], now, 'PX', ARGV[2])
redis.call('DEL', KEYS[4])
-- A sandbox bound to another node moved there (its copy here is released next): not bound back.
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  local bound = redis.call('HGET', KEYS[7], ARGV[i])
  if (not bound) or bound == ARGV[1] then
    redis.call('HSET', KEYS[7], ARGV[i], ARGV[1])
    redis.call('ZADD', KEYS[8], now, ARGV[i])
  end
end
-- Bindings of sandboxes the node has not listed for longer than the grace (killed, timed out): gone.
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - tonumber(ARGV[7]))) do
  if redis.call('HGET', KEYS[7], sid) == ARGV[1] then redis.call('HDEL', KEYS[7], sid) end
  redis.call('ZREM', KEYS[8], sid)
end
-- Reservations: expired ones go; a committed one goes once the roster (and so `active`) has its
-- sandbox, or when it was committed longer than the grace ago (the sandbox was killed since).
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local committed = redis.call('HGETALL', KEYS[6])
for i = 1, #committed, 2 do
  local token = committed[i]
  local sid, at = string.match(committed[i + 1], '^(.*)|(%d+)$')
  if (not redis.call('ZSCORE', KEYS[5], token)) or redis.call('HEXISTS', KEYS[4], sid) == 1
      or now - tonumber(at) > tonumber(ARGV[7]) then
    redis.call('ZREM', KEYS[5], token)
    redis.call('HDEL', KEYS[6], token)
  end
end
return now
"""
)

RESERVE = (
    NOW
    + """
-- KEYS: alive, node, resv, drain.  ARGV: token, hold_ms.
-- 1: reserved; 0: the node is full; -1: the node is dead; -2: it is draining (itself, or an admin's drain).
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'draining') == '1' or redis.call('EXISTS', KEYS[4]) == 1 then return -2 end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local max = tonumber(redis.call('HGET', KEYS[2], 'max') or '0')
local active = tonumber(redis.call('HGET', KEYS[2], 'active') or '0')
if max > 0 and active + redis.call('ZCARD', KEYS[3]) >= max then return 0 end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

COMMIT = (
    NOW
    + """
-- KEYS: resv, resv-sid, bindings, roster, bound.  ARGV: token, sandbox id, node id, hold_ms.
-- The reservation stays until the node's heartbeat counts the sandbox; the binding is written now,
-- and the roster has it (running) until that heartbeat: if the node dies first, it is reported lost.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. '|' .. now)
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[2], 'running')
redis.call('ZADD', KEYS[5], now, ARGV[2])
return 1
"""
)

BIND = (
    NOW
    + """
-- KEYS: bindings, roster, bound.  ARGV: sandbox id, node id.  A sandbox made outside a create (a fork).
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], 'running')
redis.call('ZADD', KEYS[3], now, ARGV[1])
return 1
"""
)

UNBIND = """
-- KEYS: bindings (or template-nodes).  ARGV: sandbox id (or template ref), node id. Only a binding still
-- naming that node goes.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

END_MOVE = """
-- KEYS: moving:<sandbox id>.  ARGV: token. The claim goes only if it is still the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
