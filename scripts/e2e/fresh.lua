-- wrk script: POST /orders (or the path in the environment variable
-- IDEM_PATH) with a new Idempotency-Key on every request.
local counter = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() * 1000 + tid)
  prefix = string.format("bench-%d-%d-%d-", os.time(), tid, math.random(1, 1e9))
  path = os.getenv("IDEM_PATH") or "/orders"
  body = '{"item":"coffee","quantity":2}'
end

function request()
  counter = counter + 1
  -- wrk.format's headers replace wrk.headers: name them all.
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer acct_bench",
    ["Idempotency-Key"] = prefix .. counter,
  }, body)
end
