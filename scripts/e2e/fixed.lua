-- wrk script: POST /orders (or IDEM_PATH) with one fixed Idempotency-Key (from IDEM_KEY),
-- so every request but the first is a replay.
function init(args)
  wrk.method = "POST"
  wrk.path = os.getenv("IDEM_PATH") or "/orders"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer acct_bench"
  wrk.headers["Idempotency-Key"] = os.getenv("IDEM_KEY") or "bench-replayed-key"
  wrk.body = '{"item":"coffee","quantity":2}'
end
