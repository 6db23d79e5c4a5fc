-- agent.lua — the load of the gateway benchmark, for wrk (bench/gateway/run.sh).
--
-- Every request is POST /v1/chat/completions with the body of the file
-- $LG_BODY (a conversation with tool calls and their results) and an
-- X-Loopguard-Run of its own ("gwb-RANDOM-N", RANDOM a thread's): each request starts a run,
-- so the gateway reads every tool result of the conversation as new,
-- decides the answer's tool call, and never serves a cached answer (a
-- repeat of the last body of a run is answered from the run's cache).
-- The direct upstream and Portkey ignore the header. Headers given with
-- wrk -H (Portkey's x-portkey-*) are kept.
local body
local path = os.getenv("LG_PATH") or "/v1/chat/completions"
local hdr, n, tid = {}, 0, 0
function init(args)
  -- a prefix of this thread's own (each wrk thread has its own Lua state)
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  tid = math.random(1, 2147483647)
  local f = assert(io.open(assert(os.getenv("LG_BODY"), "LG_BODY: no body file"), "rb"))
  body = f:read("*a")
  f:close()
  for k, v in pairs(wrk.headers) do hdr[k] = v end
  hdr["Content-Type"] = "application/json"
  hdr["Authorization"] = "Bearer " .. (os.getenv("LG_KEY") or "sk-bench") -- LG_KEY: a loopguard key (keys.sh)
end

function request()
  n = n + 1
  hdr["X-Loopguard-Run"] = "gwb-" .. tid .. "-" .. n
  return wrk.format("POST", path, hdr, body)
end
