-- wrk script of scripts/bench-http: POST the same payment to the payments
-- server, with the headers it needs (Content-Type, the caller's API key as a
-- bearer token, and X-Client-Id for servers that read that instead)
-- and an Idempotency-Key chosen by MODE.
--
--   wrk -t1 -c32 -d15s --latency -s payments.lua URL -- MODE PREFIX [KEYS]
--
--   new     a fresh key on every request: PREFIX-THREAD-N
--   replay  KEYS keys (default 100), PREFIX-1 .. PREFIX-KEYS, cycled; each
--           must have been POSTed once before (prime)
--   prime   each of the KEYS keys once, then the thread stops: run it with
--           -t1 -c1 before `replay`; it counts answers that are not 201
--
-- done() prints one line for the script to read:
--   bench-http: requests=N duration_us=N p50_us=N p99_us=N max_us=N non2xx=N errors=N
-- (errors: connect, read, write and timeout errors of wrk's sockets).
-- The URL's path is the endpoint (e.g. http://127.0.0.1:PORT/v1/payments).

wrk.method = "POST"
wrk.body = '{"amount":1000,"currency":"usd","customer":"c1"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk_bench_0123456789abcdef"  -- scripts/bench-http's key
wrk.headers["X-Client-Id"] = "bench"

local threads = 0
function setup(thread)  -- in wrk's main Lua state, once per thread
  threads = threads + 1
  thread:set("id", threads)
end

local mode, prefix, keys
local counter = 0
local not_201 = 0
local answered = 0

function init(args)
  mode = args[1] or "new"
  prefix = args[2] or "bench"
  keys = tonumber(args[3] or "100")
  if mode ~= "new" and mode ~= "replay" and mode ~= "prime" then
    error("payments.lua: MODE is new, replay or prime, not " .. mode)
  end
  if mode == "new" then
    prefix = prefix .. "-" .. tostring(wrk.thread:get("id") or 0)
  end
  if mode == "prime" then
    -- Defined only here: wrk parses headers and bodies only when a script has
    -- a response() function, which would slow the measured runs.
    response = function(status)
      answered = answered + 1
      if status ~= 201 then
        not_201 = not_201 + 1
        io.stderr:write("payments.lua: prime answered " .. status .. "\n")
      end
      if answered >= keys then
        wrk.thread:stop()
      end
    end
  end
end

-- wrk calls request() once more at start-up to check it: the key it takes is
-- never sent. Cycling modulo KEYS still covers every key.
function request()
  counter = counter + 1
  if mode == "new" then
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. counter
  else
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. ((counter - 1) % keys + 1)
  end
  return wrk.format()
end

function done(summary, latency)
  local e = summary.errors
  io.write(string.format(
    "bench-http: requests=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d non2xx=%d errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, e.status, e.connect + e.read + e.write + e.timeout))
end
