-- agent.lua — the load of the gateway benchmark, for wrk (bench/gateway/run.sh).
--
-- Every request is POST /v1/chat/completions ($LG_PATH: another path, as
-- the benchmark's passthrough target sends) with the body of the file
-- $LG_BODY (a conversation with tool calls and their results). Headers
-- given with wrk -H (Portkey's x-portkey-*) are kept. Two modes
-- ($LG_GW_MODE):
--
-- fresh (the default): each request has an X-Loopguard-Run of its own
--   ("gwb-RANDOM-N", RANDOM a thread's), so each starts a run: the gateway
--   reads every tool result of the conversation as new, decides the
--   answer's tool call, and never serves a cached answer (a repeat of the
--   last body of a run is answered from the run's cache).
-- steady: an agent loop, one a connection (run.sh gives each connection a
--   wrk thread of its own, so this state is the connection's). A run is
--   $LG_GW_TURNS (10) requests: the first is $LG_BODY, each next one the
--   conversation so far with the call the previous answer asked for and
--   its result appended, so the gateway reads one new result a request.
--   The body says "user":"bench-steady", which makes the fake upstream
--   (upstream.c) ask each turn for the conversation's next call, call_s<N>
--   on record N, N the tool results it holds: the call this script
--   appends, without reading the answer.
-- The direct upstream and Portkey ignore X-Loopguard-Run.
local body
local path = os.getenv("LG_PATH") or "/v1/chat/completions"
local steady = os.getenv("LG_GW_MODE") == "steady"
local turns = tonumber(os.getenv("LG_GW_TURNS") or "10")
local hdr, n, tid = {}, 0, 0
local prefix, suffix, base_results, hist, turn, run = "", "", 0, {}, 0, 0
local TURN = [[,{"role":"assistant","content":null,"tool_calls":[{"id":"call_s%06d","type":"function","function":{"name":"write_record","arguments":"{\"record_id\":%d,\"value\":\"A\"}"}}]},{"role":"tool","tool_call_id":"call_s%06d","content":"{\"ok\":true,\"record_id\":%d}"}]]

function init(args)
  -- a prefix of this thread's own (each wrk thread has its own Lua state)
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  tid = math.random(1, 2147483647)
  local f = assert(io.open(assert(os.getenv("LG_BODY"), "LG_BODY: no body file"), "rb"))
  body = f:read("*a")
  f:close()
  if steady then
    body = body:gsub("^{", '{"user":"bench-steady",', 1)
    local at = assert(body:find('],"tools":', 1, true), "LG_BODY: no messages before tools")
    prefix, suffix = body:sub(1, at - 1), body:sub(at)
    for _ in body:gmatch('"tool_call_id"') do base_results = base_results + 1 end
  end
  for k, v in pairs(wrk.headers) do hdr[k] = v end
  hdr["Content-Type"] = "application/json"
  hdr["Authorization"] = "Bearer " .. (os.getenv("LG_KEY") or "sk-bench") -- LG_KEY: a loopguard key (keys.sh)
end

function request()
  if steady then
    hdr["X-Loopguard-Run"] = "gws-" .. tid .. "-" .. run
    return wrk.format("POST", path, hdr, prefix .. table.concat(hist) .. suffix)
  end
  n = n + 1
  hdr["X-Loopguard-Run"] = "gwb-" .. tid .. "-" .. n
  return wrk.format("POST", path, hdr, body)
end

if steady then
  function response(status, headers, rbody)
    if status ~= 200 then return end -- the same turn again (wrk counts the error)
    local k = base_results + turn
    turn = turn + 1
    if turn >= turns then
      turn, hist, run = 0, {}, run + 1
    else
      hist[#hist + 1] = string.format(TURN, k, k, k, k)
    end
  end
end
