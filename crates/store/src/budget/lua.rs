//! The budget's Lua fragments shared by its scripts: which backends the operations of an
//! upstream take out (`out_ops`), and the script that puts one operation.

/// Lua: `out_ops(key, skip)` → the backends out by an active operation of hash `key`
/// (drain, maint, weight 0), each once, leaving out field `skip`; then whether a record
/// without expiry is there and the latest expiry (both over the other fields). Needs `now`.
macro_rules! out_ops_lua {
    () => {
        r#"
local function out_ops(key, skip)
  local o = redis.call('HGETALL', key)
  local list, seen, forever, longest = {}, {}, false, 0
  for i = 1, #o, 2 do
    local u, k = string.match(o[i + 1], '^(%d+)\n([^\n]+)\n')
    u = tonumber(u)
    if u ~= nil and o[i] ~= skip and (u == 0 or u > now) then
      if u == 0 then forever = true elseif u > longest then longest = u end
      if k == 'drain' or k == 'maint' or k == 'w:0' or string.sub(k, 1, 6) == 'claim:' then
        local b = string.gsub((string.gsub(o[i], '#w$', '')), '#c$', '')
        if not seen[b] then seen[b] = true; list[#list + 1] = b end
      end
    end
  end
  return list, forever, longest
end
"#
    };
}
pub(super) use out_ops_lua;

/// KEYS: claims, ops, version. ARGV: field, backend, kind, ttl_ms (0 = none), force (0|1), by,
/// reason, max_out, total, takes_out (0|1).
/// Returns {0, now, until} written; {1, out, max_out} over the fraction; {2, total} last backend.
pub(super) const PUT_OP_LUA: &str = concat!(
    r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"#,
    out_ops_lua!(),
    r#"
local field, backend, kind = ARGV[1], ARGV[2], ARGV[3]
local ttl, force = tonumber(ARGV[4]), ARGV[5] == '1'
local max_out, total, takes = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
-- The record replaced counts: a backend it took out is out already.
local list = out_ops(KEYS[2], nil)
local _, forever, longest = out_ops(KEYS[2], field)
if takes then
  local seen, n = {}, 0
  for _, b in ipairs(list) do seen[b] = true; n = n + 1 end
  -- within the budget: the culls and the operations neither forced nor emergency claims
  local within, nw = {}, 0
  local o = redis.call('HGETALL', KEYS[2])
  for i = 1, #o, 2 do
    local u, k, f = string.match(o[i + 1], '^(%d+)\n([^\n]+)\n%d+\n(%d)\n')
    u = tonumber(u)
    if u ~= nil and (u == 0 or u > now) and f ~= '1'
      and (k == 'drain' or k == 'maint' or k == 'w:0'
        or (string.sub(k, 1, 6) == 'claim:' and string.sub(k, -2) ~= ':1')) then
      local b = string.gsub((string.gsub(o[i], '#w$', '')), '#c$', '')
      if not within[b] then within[b] = true; nw = nw + 1 end
    end
  end
  local c = redis.call('HGETALL', KEYS[1])
  for i = 1, #c, 2 do
    if (tonumber(c[i + 1]) or 0) > now then
      if not seen[c[i]] then seen[c[i]] = true; n = n + 1 end
      if not within[c[i]] then within[c[i]] = true; nw = nw + 1 end
    end
  end
  if not seen[backend] then
    if n + 1 >= total then return {2, total, 0} end
    if n + 1 > max_out and not force then return {1, n + 1, max_out} end
  elseif not within[backend] then
    -- out only by a forced operation or an emergency claim, past the budget: this one
    -- would keep it out after they end, so it counts on top of those within the budget
    if nw + 1 > max_out and not force then return {1, nw + 1, max_out} end
  end
end
local o = redis.call('HGETALL', KEYS[2])
for i = 1, #o, 2 do
  local u = tonumber(string.match(o[i + 1], '^(%d+)\n') or '')
  if u ~= nil and u > 0 and u <= now then redis.call('HDEL', KEYS[2], o[i]) end
end
local until_ms = 0
if ttl > 0 then until_ms = now + ttl end
if takes then redis.call('INCR', KEYS[3]); redis.call('PEXPIRE', KEYS[3], 86400000) end
redis.call('HSET', KEYS[2], field, string.format('%d\n%s\n%d\n%s\n%s\n%s',
  until_ms, kind, now, force and '1' or '0', ARGV[6], ARGV[7]))
if until_ms == 0 then forever = true elseif until_ms > longest then longest = until_ms end
if forever then redis.call('PERSIST', KEYS[2])
else redis.call('PEXPIRE', KEYS[2], longest - now + 1000) end
return {0, now, until_ms}
"#
);
