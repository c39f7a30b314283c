-- wrk script: POST the JSON body in $BODY_FILE; count answers by status; print one parsable summary.
local body_file = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = body_file:read("*a")
body_file:close()
wrk.headers["Content-Type"] = "application/json"

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  statuses = {}
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local totals = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      totals[status] = (totals[status] or 0) + count
    end
  end
  for status, count in pairs(totals) do
    io.write(string.format("MNEMO status %d %d\n", status, count))
  end
  local e = summary.errors
  io.write(string.format("MNEMO errors connect %d read %d write %d timeout %d\n", e.connect, e.read, e.write, e.timeout))
  io.write(string.format("MNEMO latency_us p50 %d p99 %d max %d\n", latency:percentile(50), latency:percentile(99), latency.max))
  io.write(string.format("MNEMO latency_low_us p10 %d\n", latency:percentile(10)))
  io.write(string.format("MNEMO total requests %d duration_us %d\n", summary.requests, summary.duration))
end
