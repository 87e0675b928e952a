-- wrk script for bench/run: the request comes from the environment, and done()
-- prints one JSON line with the counts and percentiles wrk's text leaves out
-- (p99.9). BENCH_METHOD, BENCH_BODY_FILE, BENCH_AUTH (Authorization value),
-- BENCH_HEADERS (more headers, one "Name: value" a line, set last so they win),
-- BENCH_STOP_AFTER (responses per thread, then the thread stops: soak).

wrk.method = os.getenv("BENCH_METHOD") or "GET"
local body_file = os.getenv("BENCH_BODY_FILE")
if body_file and body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.headers["Content-Type"] = "application/json"
end
local auth = os.getenv("BENCH_AUTH")
if auth and auth ~= "" then
  wrk.headers["Authorization"] = auth
end
for line in (os.getenv("BENCH_HEADERS") or ""):gmatch("[^\n]+") do
  local name, value = line:match("^%s*([^:%s]+)%s*:%s*(.-)%s*$")
  if name then
    -- Header names are case-insensitive: drop any spelling already set, so one is sent.
    for set_name in pairs(wrk.headers) do
      if set_name:lower() == name:lower() then
        wrk.headers[set_name] = nil
      end
    end
    wrk.headers[name] = value
  end
end

local stop_after = tonumber(os.getenv("BENCH_STOP_AFTER") or "0")
if stop_after > 0 then
  local seen = 0
  function response(status, headers, body)
    seen = seen + 1
    if seen >= stop_after then
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"p999_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean))
end
