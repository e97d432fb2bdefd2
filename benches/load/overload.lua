-- wrk script of benches/load/run.sh's overload part.
--
-- * Open loop, approximately: LB_DELAY_MS is the mean of an exponential think
--   time before each request on a connection (the first one too, so the
--   connections do not start in one wave; each wrk thread seeded apart). Many
--   connections with a long mean think time offer a near-Poisson rate that
--   barely depends on how fast answers come back, as long as latency stays
--   well under the mean (run.sh reports the rate each target really got).
-- * The latency of the 2xx, measured exactly: each request carries
--   `x-seq: N` (per thread), backend.py echoes it in its 200, and the time from
--   writing request N to its answer (clock_gettime through LuaJIT's FFI) is
--   kept per 2xx. A refusal (503 of a proxy: shed, or a queue timeout) carries
--   no x-seq, so the 2xx figures do not assume anything about how fast
--   refusals are (keys.lua's derivation assumes every refusal is faster than
--   every success, which a queue that times out breaks).
-- * `done` prints keys.lua's RESULT line: the whole-histogram percentiles
--   from wrk, and ok / ok_p50_us / ok_p99_us from the exact 2xx latencies
--   (ok_matched: the 2xx whose x-seq was found, which must equal ok), and
--   n503: the 503s among the refusals.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } lb_timespec;
int clock_gettime(int clk_id, lb_timespec *tp);
]]
local ts = ffi.new("lb_timespec")
local function now_us()
   ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
   return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local delay_ms = tonumber(os.getenv("LB_DELAY_MS") or "0")

-- main state: the threads, for `done`
local threads = {}
function setup(thread)
   table.insert(threads, thread)
   thread:set("lb_thread", #threads)
end

-- thread states
local seq = 0
local started = {}
ok_lat = {}   -- read by `done` through thread:get
ok_n = 0
ok_matched = 0
n503 = 0

function init(args)
   math.randomseed(os.time() * 1000 + (lb_thread or 0) * 7919)
end

function request()
   seq = seq + 1
   started[seq] = now_us()
   return wrk.format(nil, nil, { ["x-seq"] = tostring(seq) })
end

if delay_ms > 0 then
   function delay()
      -- at most 10x the mean (a draw that long is 1 in 22,000)
      return math.min(-delay_ms * math.log(1.0 - math.random()), 10 * delay_ms)
   end
end

function response(status, headers, body)
   if status >= 200 and status < 300 then
      ok_n = ok_n + 1
      local s = tonumber(headers["x-seq"] or headers["X-Seq"] or "")
      local t0 = s and started[s]
      if t0 then
         ok_lat[#ok_lat + 1] = now_us() - t0
         started[s] = nil
         ok_matched = ok_matched + 1
      end
   elseif status == 503 then
      n503 = n503 + 1
   end
end

local function pct(sorted, p)
   if #sorted == 0 then
      return 0
   end
   local i = math.ceil(p / 100 * #sorted)
   if i < 1 then
      i = 1
   end
   return sorted[i]
end

function done(summary, latency, requests)
   local lat, ok, matched, s503 = {}, 0, 0, 0
   for _, t in ipairs(threads) do
      ok = ok + (t:get("ok_n") or 0)
      s503 = s503 + (t:get("n503") or 0)
      matched = matched + (t:get("ok_matched") or 0)
      for _, v in ipairs(t:get("ok_lat") or {}) do
         lat[#lat + 1] = v
      end
   end
   table.sort(lat)
   local n = summary.requests
   io.write(string.format(
      "RESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
      "non2xx=%d connect_err=%d read_err=%d write_err=%d timeout_err=%d " ..
      "ok=%d ok_p50_us=%d ok_p99_us=%d fail_p99_us=0 ok_matched=%d n503=%d\n",
      n, summary.duration,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
      n - ok, summary.errors.connect, summary.errors.read, summary.errors.write,
      summary.errors.timeout, ok, pct(lat, 50), pct(lat, 99), matched, s503))
end
