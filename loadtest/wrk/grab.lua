-- loadtest/wrk/grab.lua — POST /grab the way phones do, for scripts/bench.sh.
--
--   POOL=bench REPEAT=0.2 wrk -t2 -c64 -d10s --latency -s loadtest/wrk/grab.lua http://127.0.0.1:8080
--
-- Env: POOL   pool id to grab from (default "bench")
--      REPEAT fraction of requests that re-send a recently used user id (default 0.2),
--             the retries and double taps that must come back already_granted
--      PREFIX user id prefix (default "u"); a warm-up run uses another one so that
--             the measured run still meets new users
--
-- User ids are PREFIX<thread × 10,000,000 + counter>: disjoint per thread, new on
-- every non-repeat request. Each thread counts the HTTP statuses it sees in response();
-- done() sums them and prints two parseable lines (wrk's own report comes first):
--
--   statuses 200=123 410=456 503=0 other=0
--   result requests=579 duration_us=10001234 rps=57.89 p50_us=812 p99_us=4210 errors=0
--
-- Defining response() makes wrk parse every reply in Lua, which costs it some
-- throughput; both targets of a comparison are loaded with this same script.

local pool = os.getenv("POOL") or "bench"
local repeat_frac = tonumber(os.getenv("REPEAT") or "0.2")
local prefix = os.getenv("PREFIX") or "u"

local threads = {}
local next_thread = 1

-- setup runs in the main Lua state once per thread before the run.
function setup(thread)
  thread:set("tid", next_thread)
  table.insert(threads, thread)
  next_thread = next_thread + 1
end

-- Everything below runs in each thread's own Lua state.
local recent = {}          -- ring of the last ring_size ids this thread sent
local ring_size = 1024
local ring_pos, ring_len = 0, 0
local counter = 0

c200, c410, c503, cother = 0, 0, 0, 0

function init(args)
  math.randomseed(os.time() * 1000 + (tid or 0))
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  local user
  if ring_len > 0 and math.random() < repeat_frac then
    user = recent[math.random(ring_len)]
  else
    counter = counter + 1
    user = prefix .. string.format("%d", (tid or 0) * 10000000 + counter)
    ring_pos = ring_pos % ring_size + 1
    recent[ring_pos] = user
    if ring_len < ring_size then ring_len = ring_len + 1 end
  end
  return wrk.format(nil, "/grab", nil,
    '{"pool_id":"' .. pool .. '","user_id":"' .. user .. '"}')
end

function response(status, headers, body)
  if status == 200 then c200 = c200 + 1
  elseif status == 410 then c410 = c410 + 1
  elseif status == 503 then c503 = c503 + 1
  else cother = cother + 1 end
end

function done(summary, latency, requests)
  local s = { c200 = 0, c410 = 0, c503 = 0, cother = 0 }
  for _, t in ipairs(threads) do
    for k in pairs(s) do s[k] = s[k] + (t:get(k) or 0) end
  end
  io.write(string.format("statuses 200=%d 410=%d 503=%d other=%d\n",
    s.c200, s.c410, s.c503, s.cother))
  local e = summary.errors
  io.write(string.format("result requests=%d duration_us=%d rps=%.2f p50_us=%d p99_us=%d errors=%d\n",
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout))
end
