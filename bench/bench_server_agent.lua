-- bench_server_agent.lua — the load of bench_server's decision figures, for wrk.
--
-- Each connection is an agent loop: a call, then its result, then the
-- next call, on a run of its own; after 20 calls it moves to a fresh run.
-- So there is exactly one request in flight per run, a result always
-- follows its call, and rows are written all over the table. Every request
-- is a decision the server stores before it answers.
--
-- wrk keeps no state per connection, so the run travels in the call_id
-- ("RUN.N"), which every answer echoes: response() reads it and queues the
-- run's next step, and request() takes the next step from that queue (or
-- starts a fresh run). The runs PREFIX0 .. PREFIX(LG_RUNS-1) must exist
-- (LG_PREFIX, default "b"), with a policy without caps (bench_server makes
-- them).
local nruns = tonumber(os.getenv("LG_RUNS") or "20000")
local prefix = os.getenv("LG_PREFIX") or "b"
local tid = 0
function setup(thread)
  thread:set("id", tid)
  tid = tid + 1
end

local q, qh, qt = {}, 1, 0
local fresh, n = 0, 0
local hdr = { ["Content-Type"] = "application/json" }

local function call(run, k)
  n = n + 1
  return wrk.format("POST", "/v1/runs/" .. run .. "/calls", hdr,
    '{"tool":"search","call_id":"' .. run .. "." .. k ..
    '","args":{"q":"item ' .. n .. '","page":' .. (n % 7) .. '}}')
end

function request()
  if qh <= qt then
    local r = q[qh]
    q[qh] = nil
    qh = qh + 1
    if r[3] then
      return wrk.format("POST", "/v1/runs/" .. r[1] .. "/results", hdr,
        '{"call_id":"' .. r[3] .. '","status":"progress","value":{"rows":3}}')
    end
    return call(r[1], r[2])
  end
  fresh = fresh + 1
  return call(prefix .. ((id * 100003 + fresh) % nruns), 1)
end

function response(status, headers, body)
  local cid = body:match('"call_id":"([^"]*)"')
  if not cid or status ~= 200 then return end
  local run, k = cid:match("^(.*)%.(%d+)$")
  if not run then return end
  k = tonumber(k)
  qt = qt + 1
  if body:find('"fingerprint"', 1, true) then
    -- the answer to a call: its result next (if it ran), else the next call
    if body:find('"action":"execute"', 1, true) then q[qt] = { run, k, cid } else q[qt] = { run, k + 1 } end
  elseif k < 20 then
    q[qt] = { run, k + 1 }
  else
    qt = qt - 1 -- the run has had its 20 calls: the next request starts a fresh one
  end
end
