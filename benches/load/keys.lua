-- wrk script for benches/load/run.sh.
--
-- * Every request carries `x-api-key` from a small rotating set (LB_KEYS keys,
--   default 8), pre-formatted once so the per-request Lua cost is one table
--   lookup. The same script is used for every target so the client does the
--   same work whatever it measures.
-- * LB_DELAY_MS > 0 adds a think time before each request on a connection
--   (used by the overload scenario to set the offered rate).
-- * `done` prints one machine-readable RESULT line. Besides the usual
--   percentiles it prints the percentiles of the *successful* (status < 400)
--   responses, derived from wrk's single histogram under the assumption that
--   every rejected response (429/503, answered by the proxy itself) is faster
--   than every successful one; `fail_p99_us` (the p99 of the rejects under
--   the same assumption) lets the reader check it: it must stay well below the
--   fastest possible success.
-- * LB_CLOSE=1 sends `Connection: close` on every request: a new TCP connection per
--   request (wrk reconnects after each response), for the per-connection costs (accept,
--   the connection's task and its registration) that keep-alive hides.

local nkeys = tonumber(os.getenv("LB_KEYS") or "8")
local delay_ms = tonumber(os.getenv("LB_DELAY_MS") or "0")
local close = os.getenv("LB_CLOSE") == "1"
local reqs = {}
local i = 0

function init(args)
   for k = 1, nkeys do
      local headers = { ["x-api-key"] = "bench-key-" .. k }
      if close then
         headers["Connection"] = "close"
      end
      reqs[k] = wrk.format(nil, nil, headers)
   end
end

function request()
   i = i % nkeys + 1
   return reqs[i]
end

if delay_ms > 0 then
   function delay()
      return delay_ms
   end
end

function done(summary, latency, requests)
   local n = summary.requests
   local bad = summary.errors.status
   local good = n - bad
   local ok_p50, ok_p99, fail_p99 = 0, 0, 0
   if n > 0 and good > 0 then
      ok_p50 = latency:percentile(100.0 * (bad + 0.5 * good) / n)
      ok_p99 = latency:percentile(100.0 - 1.0 * good / n)
   end
   if n > 0 and bad > 0 then
      fail_p99 = latency:percentile(99.0 * bad / n)
   end
   io.write(string.format(
      "RESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
      "non2xx=%d connect_err=%d read_err=%d write_err=%d timeout_err=%d " ..
      "ok=%d ok_p50_us=%d ok_p99_us=%d fail_p99_us=%d\n",
      n, summary.duration,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
      bad, summary.errors.connect, summary.errors.read, summary.errors.write,
      summary.errors.timeout, good, ok_p50, ok_p99, fail_p99))
end
