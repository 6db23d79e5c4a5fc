#!/usr/bin/env bash
# run.sh — the gateway (gateway-v1) end to end: a fake upstream (Node, no
# dependencies), `loopguard serve --upstream`, and an agent loop on the
# real `openai` npm package, through the gateway and directly.
#
# Clients: openai (chat.completions stream false/true, responses.create and .stream with
# previous_response_id), @anthropic-ai/sdk (messages, stream false/true, with
# extended thinking and without)
# the Vercel AI SDK (ai + @ai-sdk/openai-compatible, and @ai-sdk/openai's Responses
# with item references) and the OpenAI Agents SDK
# (@openai/agents: stateless, with reasoning, in a conversation; two agents
# that hand a task back and forth) and LangGraph (@langchain/langgraph
# createReactAgent on @langchain/openai, Chat Completions and Responses),
# each with its own tool loop.
# Asserts: directly, the looping agent writes the failing record until its
# own step cap; through the gateway the write runs twice at most and the
# agent ends on a final message (stream false and true); an agent that does
# not loop gets the upstream's answers untouched; the upstream never sees a
# conversation a provider rejects; the run's trace replays to the same
# decisions; bad input and a bad upstream get errors in OpenAI's shape and
# the server keeps serving.
#
# Needs node and npm: the pinned clients are installed with `npm ci` when
# missing (exit 77, skipped, when node is not installed).
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the clients, the fake upstream: HERE, FAKE

# The write's loop key ignores case and white space in its value, as a
# team would say for a tool whose values are case-insensitive.
echo '{"tools":{"write_record":{"loop_key":{"record_id":[],"value":["lower","trim"]}}}}' >"$TMP/gw-policy.json"
start_server gw --store memory: --upstream "$FAKE/v1" --log "$TMP/gw.log" --policy "$TMP/gw-policy.json"
agent() { # ENV... : runs the agent, prints its JSON
  client agent-openai.mjs "$@"
}
get() { jq_py "$1"; }

note "directly: the loop runs to the agent's own step cap"
d=$(agent BASE_URL="$FAKE/v1" MODEL=loop-write STEP_CAP=12) || fail "agent (direct)"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "direct: $d"
[ "$(echo "$d" | get 'd["ended"]')" = step_cap ] || fail "direct: $d"

for stream in 0 1; do
  note "through the gateway (stream=$stream): the write runs twice at most, the agent ends"
  g=$(agent BASE_URL="$gw_URL/v1" MODEL=loop-write STREAM=$stream) || fail "agent (gateway, stream=$stream)"
  stopped "gateway stream=$stream" "$g"

  note "with thinking on (reasoning_content, stream=$stream): a restored call carries its answer's"
  for m in loop-write stubborn pair; do
    t=$(agent BASE_URL="$gw_URL/v1" MODEL=$m STREAM=$stream THINKING=1) || fail "agent (thinking, $m, stream=$stream): $t"
    stopped "thinking $m stream=$stream" "$t"
  done

  note "a model that never gives up (stream=$stream): re-asks, then the stop's final message"
  s=$(agent BASE_URL="$gw_URL/v1" MODEL=stubborn STREAM=$stream) || fail "agent (stubborn, stream=$stream)"
  stopped "stubborn" "$s"
  echo "$s" | get 'd["final"]' | grep_q -i "stop\|same\|again" || fail "stubborn: the final message: $s"
done
# What a provider binds to its calls goes back with them, through the
# gateway as directly: Gemini's thought signature on a call (extra_content,
# in a stream's delta too, whose calls may come without an index: a new id
# a new call), and on each half of an answer the guard splits;
# OpenRouter's signed reasoning_details (a stream's pieces joined), also in
# a chunk that holds a call's delta. Without them the provider refuses the
# agent's next request, looping or not. And nothing the answer did not
# have: Groq refuses a reasoning_content, which it never sends.
note "Mistral refuses stream_options: asked again without, once for the upstream, the usage read from the stream"
d=$(agent BASE_URL="$FAKE/v1" MODEL=stubborn-mistral STREAM=raw STEP_CAP=4) || fail "mistral direct: $d"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 4 ] || fail "mistral direct: $d"
f=$(agent BASE_URL="$gw_URL/v1" MODEL=finish-mistral STREAM=raw) || fail "finish-mistral: $f"
[ "$(echo "$f" | get 'd["ended"] + str(d["executions"]["lookup"])')" = final1 ] || fail "finish-mistral: $f"
a=$(agent BASE_URL="$gw_URL/v1" MODEL=stubborn-mistral STREAM=raw) || fail "stubborn-mistral: $a"
stopped "stubborn-mistral" "$a"
[ "$(stats 'd["stream_options_refused"]')" = 1 ] || fail "mistral: the gateway did not learn at once: $(stats 'd["stream_options_refused"]')"
grep -q '"upstream_refuses_stream_options"' "$TMP/gw.log" || fail "mistral: not in the log"
curl -sf -o /dev/null -H "Content-Type: application/json" -H "X-Loopguard-Run: mistral-usage" "$gw_URL/v1/chat/completions" \
  -d '{"model":"finish-mistral","stream":true,"messages":[{"role":"user","content":"Hi"}]}' || fail "mistral usage stream"
curl -sf "$gw_URL/v1/runs/mistral-usage/trace" | grep_q '"type":"usage".*"output_tokens":10,' ||
  fail "mistral: the stream's own usage was not read: $(curl -s "$gw_URL/v1/runs/mistral-usage/trace")"

# an upstream that sends no usage: the answer's bytes count, at most (a
# token is at least a byte): here its one call, "lookup" and its 21 bytes
curl -sf -o /dev/null -H "Content-Type: application/json" -H "X-Loopguard-Run: no-usage" "$gw_URL/v1/chat/completions" \
  -d '{"model":"finish-nousage","stream":true,"messages":[{"role":"user","content":"Hi"}]}' || fail "no-usage stream"
curl -sf "$gw_URL/v1/runs/no-usage/trace" | grep_q '"type":"usage".*"output_tokens":27,' ||
  fail "no usage sent: the answer's bytes not counted: $(curl -s "$gw_URL/v1/runs/no-usage/trace")"

note "an answer that needs no guard reaches the SDK as the upstream gave it (each API, stream false and true)"
f=$(client fidelity.mjs DIRECT="$FAKE" GATEWAY="$gw_URL" MODELS=finish,loop-write,pair,finish-gemini,finish-openrouter,finish-groq,finish-azure) ||
  fail "fidelity: $f"
[ "$(echo "$f" | get 'd["compared"]')" = 54 ] || fail "fidelity: $f"

note "Gemini's thought signatures, OpenRouter's reasoning_details: kept with their calls"
for st in 1 raw; do
  d=$(agent BASE_URL="$FAKE/v1" MODEL=stubborn-gemini STREAM=$st STEP_CAP=4) || fail "gemini direct stream=$st: $d"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 4 ] || fail "gemini direct stream=$st: $d"
done
d=$(agent BASE_URL="$FAKE/v1" MODEL=stubborn-openrouter STREAM=raw STEP_CAP=4) || fail "openrouter direct: $d"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 4 ] || fail "openrouter direct: $d"
for via in gemini:0 gemini:1 gemini:raw gemini-indexless:raw openrouter:0 openrouter:raw groq:0 groq:raw; do
  st=${via#*:}
  f=$(agent BASE_URL="$gw_URL/v1" MODEL=finish-${via%:*} STREAM=$st) || fail "finish-${via%:*} stream=$st: $f"
  [ "$(echo "$f" | get 'd["ended"] + str(d["executions"]["lookup"])')" = final1 ] || fail "finish-${via%:*} stream=$st: $f"
  for m in stubborn pair; do
    a=$(agent BASE_URL="$gw_URL/v1" MODEL=$m-${via%:*} STREAM=$st) || fail "$m-${via%:*} stream=$st: $a"
    stopped "$m-${via%:*} stream=$st" "$a"
  done
  # every call of an answer refused, the re-ask's kept: a stream forwarded
  # both answers' reasoning to the client, which sends its message back
  a=$(agent BASE_URL="$gw_URL/v1" MODEL=detour-${via%:*} STREAM=$st) || fail "detour-${via%:*} stream=$st: $a"
  [ "$(echo "$a" | get '[d["executions"]["write_record"], d["executions"]["lookup"], d["ended"]]')" = '[2, 1, "final"]' ] ||
    fail "detour-${via%:*} stream=$st: $a"
  # OpenRouter's signed reasoning_details of a refused answer and of its
  # re-ask reach the client numbered apart (a client merges them by type
  # and index: merged, neither signature holds); the upstream gets the
  # refused answer's once, in the restored turn, and the client's message
  # goes with its own
  [ "$via" = openrouter:raw ] || continue
  [ "$(stats '[len(m.get("reasoning_details") or []) for m in [b for b in d["bodies"] if b.get("model") == "detour-openrouter"][-1]["messages"] if any(t["function"]["name"] == "lookup" for t in m.get("tool_calls") or [])]')" = '[1]' ] ||
    fail "detour-openrouter: the lookup's message went with another answer's reasoning_details too"
done

run=$(echo "$g" | get 'd["seen"][0]["run"] if d["seen"] else ""')
g0=$(agent BASE_URL="$gw_URL/v1" MODEL=loop-write) || fail "agent"
run=$(echo "$g0" | get 'd["seen"][0]["run"]')
[ -n "$run" ] && [ "$run" != None ] || fail "no X-Loopguard-Run: $g0"
[ "$(echo "$g0" | get 'len(set(s["run"] for s in d["seen"]))')" = 1 ] || fail "one agent run, several runs: $g0"
echo "$g0" | get '[s["action"] for s in d["seen"]]' | grep_q "block" || fail "no block action: $g0"

note "the run's trace replays to the gateway's decisions"
curl -sf "$gw_URL/v1/runs/$run/trace" >"$TMP/run.jsonl" || fail "trace"
"$LG_BIN" replay --json "$TMP/run.jsonl" >"$TMP/replay.out" || fail "replay"
sum=$(tail -n 1 "$TMP/replay.out")
[ "$(echo "$sum" | get 'd["executed_calls"]')" = 2 ] || fail "replay: $sum"
blocks_log=$(grep -c "\"gateway_intervention\".*\"run_id\":\"$run\".*\"action\":\"block\"" "$TMP/gw.log")
[ "$(echo "$sum" | get 'd["blocked_calls"]')" = "$blocks_log" ] || fail "replay blocked != logged blocks ($blocks_log): $sum"

for stream in 0 1; do
  note "no loop (stream=$stream): the agent finishes, answers untouched"
  a=$(agent BASE_URL="$FAKE/v1" MODEL=finish STREAM=$stream) || fail "agent"
  b=$(agent BASE_URL="$gw_URL/v1" MODEL=finish STREAM=$stream) || fail "agent"
  [ "$(echo "$b" | get 'd["ended"]')" = final ] || fail "finish: $b"
  [ "$(echo "$a" | get 'd["final"]')" = "$(echo "$b" | get 'd["final"]')" ] || fail "finish: $a vs $b"
  [ "$(echo "$b" | get 'd["executions"]["lookup"]')" = 1 ] || fail "finish: $b"
done
echo "$b" | get '[s["action"] for s in d["seen"]]' | grep -vq "block\|stop" || true

note "streaming: a text delta is forwarded as it arrives"
t=$(BASE_URL="$gw_URL/v1" node "$HERE/stream-timing.mjs") || fail "stream timing"
[ "$(echo "$t" | get 'd["text"]')" = "Hello from the fake upstream." ] || fail "stream text: $t"
[ "$(echo "$t" | get 'int(d["first_ms"] < d["total_ms"] - 500)')" = 1 ] || fail "the text was held back: $t"
[ "$(echo "$t" | get 'int(d["max_gap_ms"] < 750)')" = 1 ] || fail "a delta waited for the event loop's timeout (drip sends one every 250 ms): $t"

note "stream framing: chunked while the answer comes, one body of known length once it is all in hand"
hdr=(-H "Content-Type: application/json")
curl -s -N -D "$TMP/drip.h" -o /dev/null "${hdr[@]}" -d '{"model":"drip","stream":true,"messages":[{"role":"user","content":"x"}]}' \
  "$gw_URL/v1/chat/completions" || fail "drip stream"
grep -qi '^transfer-encoding: *chunked' "$TMP/drip.h" || fail "a stream still coming was not chunked: $(cat "$TMP/drip.h")"
curl -sf -o /dev/null "${hdr[@]}" -H "X-Loopguard-Run: framing-1" -d '{"model":"finish","messages":[{"role":"user","content":"x"}]}' \
  "$gw_URL/v1/chat/completions" || fail "framing: the run's first request"
curl -sf -o /dev/null "${hdr[@]}" -d '{}' "$gw_URL/v1/runs/framing-1/cancel" || fail "framing: cancel"
curl -s -D "$TMP/whole.h" -o "$TMP/whole.sse" "${hdr[@]}" -H "X-Loopguard-Run: framing-1" \
  -d '{"model":"finish","stream":true,"messages":[{"role":"user","content":"x"}]}' "$gw_URL/v1/chat/completions" || fail "framing: stream"
grep -qi '^content-type: *text/event-stream' "$TMP/whole.h" || fail "framing: not an event stream: $(cat "$TMP/whole.h")"
grep -qi '^transfer-encoding' "$TMP/whole.h" && fail "framing: a stream all in hand was chunked: $(cat "$TMP/whole.h")"
len=$(tr -d '\r' <"$TMP/whole.h" | awk -F': *' 'tolower($1)=="content-length" {print $2}')
[ "$len" = "$(wc -c <"$TMP/whole.sse")" ] || fail "framing: Content-Length $len, body $(wc -c <"$TMP/whole.sse") bytes"
[ "$(tail -c 14 "$TMP/whole.sse")" = "$(printf 'data: [DONE]\n\n')" ] || fail "framing: the stream's end: $(cat "$TMP/whole.sse")"
grep -q '"finish_reason":"stop"' "$TMP/whole.sse" || fail "framing: no final chunk: $(cat "$TMP/whole.sse")"

note "two sessions with the same start (a greeting, no tool call: a hash names them): the second is its own run; two people's are told apart"
hdr_run() { # BODY: the X-Loopguard-Run of the answer to it
  curl -s -o /dev/null -D - -H "Content-Type: application/json" -d "$1" "$gw_URL/v1/chat/completions" |
    tr -d '\r' | awk -F': ' 'tolower($1)=="x-loopguard-run"{print $2}'
}
first='{"model":"greet","messages":[{"role":"user","content":"hi"}]}'
second='{"model":"greet","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello from the fake upstream."},{"role":"user","content":"and again"}]}'
a1=$(hdr_run "$first") && a2=$(hdr_run "$second")
[ -n "$a1" ] && [ "$a1" = "$a2" ] || fail "session A: $a1 then $a2"
b1=$(hdr_run "$first") && b2=$(hdr_run "$second")
[ -n "$b1" ] && [ "$b1" != "$a1" ] && [ "$b1" = "$b2" ] || fail "session B went on in session A's run: A $a1, B $b1 then $b2"
# at the same time, for two people (the request's `user`): told apart
u1=$(hdr_run "${first%\}},\"user\":\"ada\"}") && v1=$(hdr_run "${first%\}},\"user\":\"bob\"}")
u2=$(hdr_run "${second%\}},\"user\":\"ada\"}") && v2=$(hdr_run "${second%\}},\"user\":\"bob\"}")
[ -n "$u1" ] && [ "$u1" = "$u2" ] && [ "$v1" = "$v2" ] && [ "$u1" != "$v1" ] || fail "two people, one start: ada $u1 then $u2, bob $v1 then $v2"

note "n of 2: the first choice's calls decided, the other's as the upstream sent them, never mixed"
cat >"$TMP/choices.py" <<'PY'
import json, sys
calls = {}  # (choice, call index) -> [id, name, arguments]
text = sys.stdin.read()
if text.lstrip().startswith('{'):
    for c in json.loads(text)["choices"]:
        for k, t in enumerate(c["message"].get("tool_calls") or []):
            calls[(c["index"], k)] = [t["id"], t["function"]["name"], t["function"]["arguments"]]
else:
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        for c in json.loads(line[6:]).get("choices", []):
            for t in c["delta"].get("tool_calls") or []:
                e = calls.setdefault((c["index"], t["index"]), ["", "", ""])
                e[0] = t.get("id") or e[0]
                e[1] += t.get("function", {}).get("name") or ""
                e[2] += t.get("function", {}).get("arguments") or ""
print(json.dumps(sorted([k[0], k[1], e[0], e[1], json.loads(e[2])] for k, e in calls.items())))
PY
for stream in false true; do
  out=$(curl -sf -H "Content-Type: application/json" "$gw_URL/v1/chat/completions" -d '{"model":"finish","n":2,"stream":'$stream',"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"Who is c-1?"}]}' |
    python3 "$TMP/choices.py") || fail "n=2 stream=$stream: the calls do not parse"
  echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(not ([c[:2] for c in d] == [[0, 0], [1, 0]] and all(c[3] == "lookup" and c[4] == {"customer_id": "c-1"} for c in d) and d[0][2] != d[1][2]))' ||
    fail "n=2 stream=$stream: each choice one call of its own: $out"
done

note "a chunk of no choice that is not the usage (Azure's prompt_filter_results) reaches the client"
for st in 0 1; do # the client asked for the usage, or not (the gateway asks for it anyway)
  opts=; [ $st = 1 ] && opts=',"stream_options":{"include_usage":true}'
  curl -sf -H "Content-Type: application/json" "$gw_URL/v1/chat/completions" -o "$TMP/azure.sse" \
    -d '{"model":"finish-azure","stream":true'"$opts"',"messages":[{"role":"user","content":"Hi"}]}' || fail "azure stream"
  grep -q '"prompt_filter_results"' "$TMP/azure.sse" || fail "azure: the prompt's filter results were dropped: $(head -c 600 "$TMP/azure.sse")"
  [ "$(grep -c '"usage":{' "$TMP/azure.sse")" = $st ] || fail "azure: the usage chunk (include_usage $st): $(cat "$TMP/azure.sse")"
done

note "Anthropic: a stream's end as the API sent it (its stop_sequence, its usage's cache tokens)"
body='{"model":"loop-write","max_tokens":64,"stream":true,"stop_sequences":["storage"],"messages":[{"role":"user","content":"Write record 7."}]}'
for to in "$FAKE" "$gw_URL"; do
  curl -sf -H "Content-Type: application/json" -H "anthropic-version: 2023-06-01" "$to/v1/messages" -d "$body" |
    sed -n 's/^data: \(.*"message_delta".*\)$/\1/p' >"$TMP/end.$([ "$to" = "$FAKE" ] && echo direct || echo gw)"
done
python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); sys.exit(not (a == b and a["delta"]["stop_sequence"] == "storage"))' \
  "$TMP/end.direct" "$TMP/end.gw" || fail "anthropic stream end: directly $(cat "$TMP/end.direct"), through the gateway $(cat "$TMP/end.gw")"

note "Anthropic: the input its prompt cache read and wrote counts as input (the run's tokens and cost)"
for st in false true; do
  curl -sf -o /dev/null -H "Content-Type: application/json" -H "X-Loopguard-Run: cached-$st" "$gw_URL/v1/messages" \
    -d '{"model":"finish","max_tokens":64,"stream":'$st',"messages":[{"role":"user","content":"Hi"}]}' || fail "cached stream=$st"
  # the fake: input_tokens a quarter of the messages' JSON, 100 written to the cache, 5000 read from it
  curl -sf "$gw_URL/v1/runs/cached-$st/trace" | python3 -c '
import json, sys
u = [e for e in (json.loads(l) for l in sys.stdin if l.strip() and not l.startswith("#")) if e.get("type") == "usage"]
want = (len(json.dumps([{"role": "user", "content": "Hi"}], separators=(",", ":"))) >> 2) + 100 + 5000
sys.exit(not (len(u) == 1 and u[0]["input_tokens"] == want))' || fail "cached stream=$st: $(curl -s "$gw_URL/v1/runs/cached-$st/trace")"
done

note "a client that hangs up mid-stream: the server keeps serving"
curl -s -H "Content-Type: application/json" -N --max-time 0.4 -d '{"model":"drip","stream":true,"messages":[{"role":"user","content":"x"}]}' \
  "$gw_URL/v1/chat/completions" >/dev/null 2>&1
curl -sf "$gw_URL/healthz" >/dev/null || fail "the server stopped serving after a hang-up"

for stream in 0 1; do
  note "Anthropic Messages (stream=$stream), @anthropic-ai/sdk: directly, through the gateway"
  d=$(client agent-anthropic.mjs BASE_URL="$FAKE" MODEL=loop-write STREAM=$stream) || fail "anthropic direct"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "anthropic direct: $d"
  for m in loop-write stubborn; do
    g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=$m STREAM=$stream) || fail "anthropic gateway $m"
    stopped "anthropic $m" "$g"
  done
  # Extended thinking: the provider wants the last tool use's assistant
  # turn to start with its (signed, unchanged) thinking block, so a turn
  # the gateway restores after a block carries the answer's thinking.
  d=$(client agent-anthropic.mjs BASE_URL="$FAKE" MODEL=loop-write STREAM=$stream THINKING=1) || fail "anthropic thinking direct"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "anthropic thinking direct: $d"
  for m in loop-write stubborn pair; do
    g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=$m STREAM=$stream THINKING=1) || fail "anthropic thinking gateway $m: $g"
    stopped "anthropic thinking $m" "$g"
  done
  # a stream forwards an answer's thinking as it comes: after every call of
  # it was refused and the upstream asked again (detour then looks the
  # customer up), the client's message holds both answers' thinking; the
  # upstream sees each once, in its own turn
  g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=detour STREAM=$stream THINKING=1) || fail "anthropic thinking detour: $g"
  [ "$(echo "$g" | get '[d["executions"]["write_record"], d["executions"]["lookup"], d["ended"]]')" = '[2, 1, "final"]' ] ||
    fail "anthropic thinking detour (stream=$stream): $g"
  [ "$(stats 'd["thinking_repeated"]')" = 0 ] ||
    fail "anthropic thinking (stream=$stream): the upstream got one answer's thinking in two turns"
  # the SDK's beta path (POST /v1/messages?beta=true, Claude Code's) is guarded too
  g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=loop-write STREAM=$stream THINKING=1 BETA=1) || fail "anthropic beta gateway: $g"
  stopped "anthropic beta" "$g"
  # A text beside every turn's results (Claude Code's reminders) starts no
  # episode: the loop is still counted and stopped.
  g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=loop-write STREAM=$stream REMINDER=1) || fail "anthropic reminders: $g"
  stopped "anthropic with a reminder beside every result" "$g"
  a=$(client agent-anthropic.mjs BASE_URL="$FAKE" MODEL=finish STREAM=$stream) || fail "anthropic finish"
  b=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=finish STREAM=$stream) || fail "anthropic finish"
  [ "$(echo "$a" | get 'd["final"]')" = "$(echo "$b" | get 'd["final"]')" ] || fail "anthropic finish: $a vs $b"
  # a tool_use block reaches the client with every member the API gave it (its caller)
  [ "$(echo "$b" | get 'd["shapes"]')" = "$(echo "$a" | get 'd["shapes"]')" ] || fail "anthropic finish: tool_use blocks changed: $a vs $b"
  echo "$b" | get 'd["shapes"][0]' | grep_q '"caller"' || fail "anthropic finish: no caller: $b"
done
# A re-ask the upstream refuses after the client's stream began (picky
# takes no third tool result, and the re-ask after the block carries it):
# the stream ends on an error event that says what the upstream answered.
for api in agent-openai.mjs:/v1 agent-anthropic.mjs: agent-responses.mjs:/v1; do
  out=$(client "${api%%:*}" BASE_URL="$gw_URL${api#*:}" MODEL=picky STREAM=1 2>&1) && fail "picky ${api%%:*}: no error: $out"
  case $out in
  *"answered 400: picky: this conversation holds three tool results"*) ;;
  *) fail "picky ${api%%:*}: the stream's error does not say what the upstream answered: $out" ;;
  esac
done
# The same with a refusal that is an HTML page with a byte not UTF-8: the
# error event is still JSON a strict reader takes (Python's, from bytes).
python3 - "$gw_URL" <<'PY' || fail "picky-html: the stream's error event is not strict JSON"
import json, sys, urllib.request
url = sys.argv[1] + "/v1/chat/completions"
tools = [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]
msgs = [{"role": "user", "content": "Write record 7."}]
def ask(stream):
    body = json.dumps({"model": "picky-html", "stream": stream, "messages": msgs, "tools": tools}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json", "X-Loopguard-Run": "picky-html"})
    return urllib.request.urlopen(req).read()
for i in range(2):  # executed, then observed: each answered with its call
    call = json.loads(ask(False))["choices"][0]["message"]["tool_calls"][0]
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": call["id"], "content": "Error: read-only."}]
events = [line[6:] for line in ask(True).split(b"\n") if line.startswith(b"data: ") and line != b"data: [DONE]"]
err = [json.loads(e.decode("utf-8")) for e in events if b'"error"' in e]  # strict: bytes must be UTF-8
assert err and "answered 400: <html>" in err[-1]["error"]["message"], events[-3:]
PY
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' -d '{"model":' "$gw_URL/v1/messages")
[ "$code" = 400 ] && [ "$(get 'd["type"]' <"$TMP/e.json")" = error ] || fail "anthropic malformed: $code $(cat "$TMP/e.json")"

for stream in 0 1; do
  note "OpenAI Responses (previous_response_id, stream=$stream): directly, through the gateway"
  d=$(client agent-responses.mjs BASE_URL="$FAKE/v1" MODEL=loop-write STREAM=$stream) || fail "responses direct"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "responses direct: $d"
  for m in loop-write stubborn; do
    g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=$m STREAM=$stream) || fail "responses gateway $m"
    stopped "responses $m" "$g"
    [ "$(echo "$g" | get 'int(len(set(s["run"] for s in d["seen"])) <= 1)')" = 1 ] || fail "responses: several runs: $g"
  done
  b=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=finish STREAM=$stream) || fail "responses finish"
  [ "$(echo "$b" | get 'd["final"]')" = 'Done: {"customer_id":"c-1","name":"Ada"}' ] || fail "responses finish: $b"
done

# An answer whose every call is refused: the upstream's next request holds
# that answer's items as the provider made them, its message with what the
# model said beside the call too (detour says "Writing the record." with
# each write), each item once (the fake refuses an item twice); until
# session 41 a Responses answer's message was left out.
for stream in 0 1; do
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=detour STATELESS=1 STREAM=$stream) || fail "responses detour stream=$stream: $g"
  [ "$(echo "$g" | get '[d["executions"]["write_record"], d["executions"]["lookup"], d["ended"]]')" = '[2, 1, "final"]' ] ||
    fail "responses detour stream=$stream: $g"
done
stats 'sum(1 for b in d["bodies"] if b.get("model") == "detour" and isinstance(b.get("input"), list) for it, nxt in zip(b["input"], b["input"][1:]) if it.get("type") == "message" and it.get("role") == "assistant" and "Writing the record." in json.dumps(it.get("content")) and nxt.get("type") == "function_call" and any(o.get("call_id") == nxt.get("call_id") and "loopguard did not run" in str(o.get("output")) for o in b["input"]))' >"$TMP/detour.count"
[ "$(cat "$TMP/detour.count")" -ge 2 ] || fail "responses detour: the refused answer's message was not restored before its call ($(cat "$TMP/detour.count") bodies)"
# A client that keeps every item a stream gave it (each output_item.done,
# the refused answer's message among them) and sends them back whole: the
# restored message is not sent twice (the fake refuses a duplicate id).
python3 - "$gw_URL" <<'PY' || fail "responses detour, items kept from the stream: see above"
import json, sys, urllib.request
tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("write_record", "lookup")]
conv, writes = [{"role": "user", "content": "Write record 7 with value A."}], 0
for turn in range(8):
    body = json.dumps({"model": "detour", "stream": True, "input": conv, "tools": tools}).encode()
    req = urllib.request.Request(sys.argv[1] + "/v1/responses", body, {"Content-Type": "application/json"})
    evs = [json.loads(l[6:]) for l in urllib.request.urlopen(req).read().decode().split("\n") if l.startswith("data: ")]
    errs = [e for e in evs if e["type"] in ("error", "response.failed")]
    assert not errs, errs
    items = [{k: v for k, v in e["item"].items() if k != "status"} for e in evs if e["type"] == "response.output_item.done"]
    calls = [it for it in items if it.get("type") == "function_call"]
    conv += items
    if not calls:
        text = "".join(p.get("text", "") for it in items if it.get("type") == "message" for p in it.get("content", []))
        assert text.startswith("Done"), text
        break
    for c in calls:
        writes += c["name"] == "write_record"
        conv.append({"type": "function_call_output", "call_id": c["call_id"], "output": "Error: read-only." if c["name"] == "write_record" else '{"name": "Ada"}'})
else:
    raise SystemExit("no final answer in 8 turns")
assert writes == 2, writes
PY

# A custom tool (free-text input: Codex's apply_patch is one): its calls
# are custom_tool_call items (Chat Completions: tool calls of type
# "custom"), the same patch every time; guarded as a function's, its
# arguments {"input": TEXT}. Until session 41 they went through unread:
# the loop ran to the agent's step cap.
d=$(client agent-responses.mjs BASE_URL="$FAKE/v1" MODEL=loop-write CUSTOM=1) || fail "custom direct: $d"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "custom direct: $d"
for stream in 0 1; do
  note "a custom tool's calls (Responses, stream=$stream; previous_response_id, then the whole conversation each turn)"
  for st in 0 1; do
    g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-write CUSTOM=1 STATELESS=$st STREAM=$stream) || fail "custom gateway: $g"
    stopped "responses custom stateless=$st stream=$stream" "$g"
    [ "$(echo "$g" | get 'int(len(set(s["run"] for s in d["seen"])) <= 1)')" = 1 ] || fail "custom: several runs: $g"
  done
done
# The built-in tools the client runs (apply_patch_call, shell_call,
# computer_call items): their calls are the operation's or the action's
# object, their results the output item's (a failed patch, a command's
# exit status: retryable; a screenshot, by its digest), a refused one
# answered with an output of its kind, the hidden tool taken out of tools
# by its type, the observe rung's note in a shell's stderr (its output is
# chunks: a text part there is refused), a computer call's in a user
# message after its output (which holds no text), a local shell's too (its
# output is Codex's JSON text, which the note would break). Until session
# 41 (the computer's: 43, the local shell's: 45) they went through unread.
for tool in local_shell apply_patch shell computer; do # (local_shell first: the checks below read the last bodies of the others)
  d=$(client agent-responses.mjs BASE_URL="$FAKE/v1" MODEL=loop-builtin BUILTIN=$tool) || fail "$tool direct: $d"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "$tool direct: $d"
  for stream in 0 1; do
    note "the built-in $tool tool's calls (Responses, stream=$stream)"
    for st in 0 1; do
      g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=$tool STATELESS=$st STREAM=$stream) || fail "$tool gateway: $g"
      stopped "responses $tool stateless=$st stream=$stream" "$g"
      # the model gave up in its own words once the tool was hidden
      echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "$tool: the tool was not hidden: $g"
    done
  done
done
stats '[o["output"][-1]["stderr"] for b in d["bodies"] if b.get("model") == "loop-builtin" and isinstance(b.get("input"), list) for o in b["input"] if o.get("type") == "shell_call_output"]' |
  grep_q 'read-only file system\\n\\n\\n\[loopguard\] I have now called shell' || fail "shell: the observe rung's note is not in the output's stderr: $(stats '[b.get("input") for b in d["bodies"] if b.get("model") == "loop-builtin"][-3:]')"
g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=shell) || fail "shell gateway: $g"
run=$(echo "$g" | get 'd["seen"][0]["run"]')
curl -sf "$gw_URL/v1/runs/$run/trace" >"$TMP/shell.jsonl" || fail "shell: no trace"
grep '"type":"call"' "$TMP/shell.jsonl" | head -1 | grep_q '"tool":"shell","args":{"commands":\["write-record 7 A"\]' ||
  fail "shell: the call is not the action: $(head -c 2000 "$TMP/shell.jsonl")"
grep '"type":"result"' "$TMP/shell.jsonl" | head -1 | grep_q '"status":"retryable","value":"write-record: read-only file system\\n"' ||
  fail "shell: the result is not the command's failure: $(head -c 3000 "$TMP/shell.jsonl")"

note "a computer call's notes: user messages after its output, the refused call answered with the last screen"
# the observe rung's note and a refusal's text: each a user message of its
# own right after the computer call's output (a message between a call and
# its output is refused: the fake checks), the refused call's output the
# screen the client sent last, never a member of ours
stats '[[i.get("type") or i.get("role"), (i.get("content") or [{}])[0].get("text", "")[:60] if i.get("type") == "message" else i.get("output", {}).get("image_url", "")[-12:] if i.get("type") == "computer_call_output" else ""] for b in d["bodies"] if b.get("model") == "loop-builtin" and isinstance(b.get("input"), list) and json.dumps(b["input"]).find("computer_call_output") > 0 for i in b["input"]]' >"$TMP/computer.items"
grep_q '\["computer_call_output", "RU5ErkJggg=="\], \["message", "\[loopguard\] I have now called computer_use_preview with the "\]' "$TMP/computer.items" ||
  fail "computer: the observe note is not a message after the output: $(head -c 3000 "$TMP/computer.items")"
grep_q '\["computer_call_output", "RU5ErkJggg=="\], \["message", "Error: loopguard did not run this call (same_call_repeat). I"\]' "$TMP/computer.items" ||
  fail "computer: the refused call is not answered with the last screen and the refusal: $(head -c 3000 "$TMP/computer.items")"
# the call is the action, the result the screenshot's digest (the same
# screen, the same result: no progress), never the image itself
g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=computer) || fail "computer gateway: $g"
run=$(echo "$g" | get 'd["seen"][0]["run"]')
curl -sf "$gw_URL/v1/runs/$run/trace" >"$TMP/computer.jsonl" || fail "computer: no trace"
screen=data:image/png\;base64,$(sed -n "s/^export const SCREEN_B64 = '\(.*\)';$/\1/p" "$HERE_SRC/screens.mjs")
# the digest of what the part shows, its image_url as JSON (a quoted string)
digest=$(printf '"%s"' "$screen" | sha256sum | cut -c1-16)
[ ${#digest} = 16 ] && [ ${#screen} -gt 40 ] || fail "computer: no screen in screens.mjs"
grep '"type":"call"' "$TMP/computer.jsonl" | head -1 | grep_q '"tool":"computer_use_preview","args":{"type":"click","button":"left","x":312,"y":208}' ||
  fail "computer: the call is not the action: $(head -c 2000 "$TMP/computer.jsonl")"
[ "$(grep -c "\"type\":\"result\".*\"value\":\"\[computer_screenshot sha256:$digest\]\"" "$TMP/computer.jsonl")" = 2 ] ||
  fail "computer: the results are not the screen's digest ($digest): $(head -c 3000 "$TMP/computer.jsonl")"
grep_q base64 "$TMP/computer.jsonl" && fail "computer: an image in the trace"
"$LG_BIN" replay --json "$TMP/computer.jsonl" >"$TMP/computer.replay" || fail "computer: the trace does not replay"
[ "$(tail -n 1 "$TMP/computer.replay" | get '[d["executed_calls"], d["blocked_calls"]]')" = '[2, 1]' ] ||
  fail "computer: replay: $(tail -n 1 "$TMP/computer.replay")"
# a screen the run has not had is progress (its count the result's
# progress_version), so the same click while the pages turn is no loop:
# the agent runs to its own step cap, as directly; two screens in turn (a
# menu opened and closed) are no progress, and the repeats are stopped
g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=computer SCREENS=new) || fail "computer, new screens: $g"
[ "$(echo "$g" | get '[d["ended"], d["executions"]["write_record"], sorted(set(s["action"] for s in d["seen"]))]')" = '["step_cap", 12, ["execute", "observe"]]' ] ||
  fail "computer, new screens: stopped: $g"
curl -sf "$gw_URL/v1/runs/$(echo "$g" | get 'd["seen"][0]["run"]')/trace" >"$TMP/pages.jsonl" || fail "computer, new screens: no trace"
[ "$(grep '"type":"result"' "$TMP/pages.jsonl" | sed -n 's/.*"progress_version":\([0-9]*\).*/\1/p' | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 9 10 " ] ||
  fail "computer, new screens: not one progress a new screen after the first: $(grep '"type":"result"' "$TMP/pages.jsonl" | head -c 2000)"
"$LG_BIN" replay --json "$TMP/pages.jsonl" >"$TMP/pages.replay" || fail "computer, new screens: the trace does not replay"
[ "$(tail -n 1 "$TMP/pages.replay" | get '[d["executed_calls"], d["blocked_calls"]]')" = '[12, 0]' ] ||
  fail "computer, new screens: replay: $(tail -n 1 "$TMP/pages.replay")"
for st in 0 1; do
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=computer SCREENS=toggle STATELESS=$st STREAM=$st) || fail "computer, two screens: $g"
  [ "$(echo "$g" | get '[d["ended"], d["executions"]["write_record"]]')" = '["final", 4]' ] || fail "computer, two screens in turn, stateless=$st: $g"
done
# the older local shell (local_shell_call, an exec action): its output's
# exit code read from Codex's JSON text, the note a user message after it,
# a refused call answered with an output of its own id (the API requires
# one) and Codex's shape
note "the older local shell: its output's exit code, its note a message of its own, a refused call's output"
g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=local_shell STATELESS=1) || fail "local_shell gateway: $g"
curl -sf "$gw_URL/v1/runs/$(echo "$g" | get 'd["seen"][0]["run"]')/trace" >"$TMP/lsh.jsonl" || fail "local_shell: no trace"
grep '"type":"call"' "$TMP/lsh.jsonl" | head -1 | grep_q '"tool":"local_shell","args":{"type":"exec","command":\["write-record","7","A"\]' ||
  fail "local_shell: the call is not the action: $(head -c 2000 "$TMP/lsh.jsonl")"
grep '"type":"result"' "$TMP/lsh.jsonl" | head -1 | grep_q '"status":"retryable"' ||
  fail "local_shell: exit code 1 is not a failure: $(head -c 3000 "$TMP/lsh.jsonl")"
curl -sf "$FAKE/stats" >"$TMP/lsh.stats" || fail "local_shell: stats"
python3 - "$TMP/lsh.stats" <<'PY' || fail "local_shell: the note or the refused output: $(get '[b.get("input") for b in d["bodies"] if b.get("model") == "loop-builtin"][-1:]' <"$TMP/lsh.stats")"
import json, sys
d = json.load(open(sys.argv[1]))
ins = [b["input"] for b in d["bodies"] if b.get("model") == "loop-builtin" and isinstance(b.get("input"), list)
       and any(o.get("type") == "local_shell_call_output" for o in b["input"])][-1]
outs = [o for o in ins if o.get("type") == "local_shell_call_output"]
notes = [o for o in ins if o.get("role") == "user" and "[loopguard]" in json.dumps(o)]
last = json.loads(outs[-1]["output"])
sys.exit(not (all("[loopguard]" not in o["output"] for o in outs) and len(notes) == 1
              and last["metadata"]["exit_code"] == 1 and "did not run this call" in last["output"]
              and outs[-1]["id"] == outs[-1]["call_id"]))
PY

# Codex answers a local shell's call with a function_call_output (the API
# takes it): the same loop, stopped the same way
for stream in 0 1; do
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=local_shell CODEX=1 STREAM=$stream) || fail "local_shell, Codex's outputs: $g"
  stopped "local_shell answered by function_call_output, stream=$stream" "$g"
done

# results RUN EXPR: EXPR over the run's trace's result events, a list
# bound to r, printed as JSON
results() {
  curl -sf "$gw_URL/v1/runs/$1/trace" | python3 -c '
import json, sys
r = [e for e in (json.loads(l) for l in sys.stdin if l.strip() and not l.startswith("#")) if e.get("type") == "result"]
print(json.dumps('"$2"'))'
}

# Codex's own shell tool (a function named shell, each answer a text whose
# exit code says the command failed: JSON, or the plain text of its
# freeform shell or its exec_command; or OpenHands' trailer, as its
# execute_bash answers through LiteLLM; the duration in it differs every
# time): a model trying one command after another, never the same, is no
# repeat, but every result is a failure, so the failure streak
# (policy-v1's default: 5) stops it. Directly it runs to its step cap. On
# both APIs Codex speaks (wire_api "responses" and "chat"); exit code 0 is
# no failure.
note "Codex's shell tool: a failed command's exit code read (its three texts, OpenHands' trailer), the failure streak"
d=$(client agent-responses.mjs BASE_URL="$FAKE/v1" MODEL=flail SHELL_TOOLS=shell STATELESS=1) || fail "flail direct: $d"
[ "$(echo "$d" | get '[d["ended"], d["executions"]["shell"]]')" = '["step_cap", 12]' ] || fail "flail direct: $d"
for way in "agent-responses.mjs STATELESS=1" "agent-responses.mjs STREAM=1 SHELL_OUTPUT=freeform" \
  "agent-openai.mjs STREAM=1 SHELL_OUTPUT=exec" "agent-openai.mjs" "agent-openai.mjs SHELL_OUTPUT=freeform" "agent-openai.mjs SHELL_OUTPUT=exec" \
  "agent-openai.mjs SHELL_OUTPUT=openhands"; do
  g=$(client $way BASE_URL="$gw_URL/v1" MODEL=flail SHELL_TOOLS=shell) || fail "flail through the gateway ($way): $g"
  [ "$(echo "$g" | get '[d["ended"], d["executions"]["shell"]]')" = '["final", 5]' ] ||
    fail "flail ($way): not stopped by the failure streak: $g"
  case $way in agent-openai.mjs*STREAM=1*) continue ;; agent-openai.mjs*) ;; *) continue ;; esac # (a run printed)
  run=$(echo "$g" | get 'd["seen"][0]["run"]')
  jq_url "$gw_URL/v1/runs/$run" 'd["terminal_reason"]' | grep_q '^failure_streak$' ||
    fail "flail ($way): the stop: $(curl -s "$gw_URL/v1/runs/$run")"
  [ "$(results "$run" 'len(r) == 5 and all(x["status"] == "retryable" and "Error 2" in x["value"] for x in r)')" = true ] ||
    fail "flail ($way): the results are not failures with the command's text: $(results "$run" r)"
done
for out in json freeform exec openhands; do # commands that work: progress, never the failure streak
  g=$(client agent-openai.mjs BASE_URL="$gw_URL/v1" MODEL=flail SHELL_TOOLS=shell SHELL_OUTPUT=$out SHELL_EXIT=0) || fail "flail, exit 0 ($out): $g"
  [ "$(echo "$g" | get '[d["ended"], d["executions"]["shell"]]')" = '["step_cap", 12]' ] || fail "flail, exit 0 ($out): stopped: $g"
done

# Codex's unified exec: a long build started by exec_command and polled
# with the same write_stdin call while it runs (OpenHands' execute_bash:
# with an empty command). A poll that brings output the run has not seen
# is progress (its progress_version in the trace), so the eight polls all
# run and the agent ends on its own answer; a build that never prints
# again is polled in vain, the same call with nothing new: the repeat
# ladder's, and so is one that prints only the time and an id (a heartbeat).
note "Codex's unified exec: polls of a running build that prints are progress; a silent one is a repeat"
d=$(client agent-responses.mjs BASE_URL="$FAKE/v1" MODEL=poll SHELL_TOOLS=exec STATELESS=1) || fail "poll direct: $d"
[ "$(echo "$d" | get '[d["ended"], d["executions"]["exec_command"], d["executions"]["write_stdin"]]')" = '["final", 1, 8]' ] || fail "poll direct: $d"
for way in "agent-responses.mjs STATELESS=1 SHELL_TOOLS=exec" "agent-responses.mjs STREAM=1 SHELL_TOOLS=exec" \
  "agent-openai.mjs SHELL_TOOLS=exec" "agent-openai.mjs SHELL_TOOLS=openhands"; do
  case $way in *openhands) polls=execute_bash n=9 ;; *) polls=write_stdin n=8 ;; esac # (OpenHands polls with the tool that started the build)
  g=$(client $way BASE_URL="$gw_URL/v1" MODEL=poll) || fail "poll ($way): $g"
  [ "$(echo "$g" | get '[d["ended"], d["final"], d["executions"]["'$polls'"]]')" = '["final", "Done: the build finished.", '$n']' ] ||
    fail "poll ($way): the polls of a build that prints were not let run: $g"
  h=$(client $way BASE_URL="$gw_URL/v1" MODEL=poll SHELL_HUNG=1) || fail "poll, hung ($way): $h"
  [ "$(echo "$h" | get 'int(d["ended"] == "final" and d["executions"]["'$polls'"] <= 2 + '$((n - 8))')')" = 1 ] ||
    fail "poll, hung ($way): a silent build polled without end: $h"
  h=$(client $way BASE_URL="$gw_URL/v1" MODEL=poll SHELL_HUNG=clock) || fail "poll, hung with a clock ($way): $h"
  [ "$(echo "$h" | get 'int(d["ended"] == "final" and d["executions"]["'$polls'"] <= 3 + '$((n - 8))')')" = 1 ] ||
    fail "poll, hung with a clock ($way): a build that says only the time and an id polled without end: $h"
done
run=$(echo "$g" | get 'd["seen"][0]["run"]')
[ "$(results "$run" '[x.get("progress_version", x["status"]) for x in r]')" = '[1, 2, 3, 4, 5, 6, 7, 8, "progress"]' ] ||
  fail "poll: the polls' results are not progress: $(results "$run" r)"
curl -sf "$gw_URL/v1/runs/$run/trace" >"$TMP/poll.jsonl" || fail "poll: no trace"
"$LG_BIN" replay --json "$TMP/poll.jsonl" >"$TMP/poll.replay" || fail "poll: the trace does not replay"
[ "$(tail -n 1 "$TMP/poll.replay" | get '[d["executed_calls"], d["blocked_calls"], d["terminal_reason"]]')" = '[9, 0, null]' ] ||
  fail "poll: replay: $(tail -n 1 "$TMP/poll.replay")"
# Claude Code's background Bash, polled with BashOutput (its <status>,
# <stdout> and a <timestamp> that changes every time), on Messages
note "Claude Code's BashOutput: polls of a running build that prints are progress; a silent one is a repeat"
for st in 0 1; do
  g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=poll CLAUDE_CODE=1 STREAM=$st) || fail "BashOutput, stream=$st: $g"
  [ "$(echo "$g" | get '[d["ended"], d["final"], d["executions"]["BashOutput"]]')" = '["final", "Done: the build finished.", 9]' ] ||
    fail "BashOutput, stream=$st: the polls of a build that prints were not let run: $g"
  [ $st = 0 ] && run=$(echo "$g" | get 'd["seen"][0]["run"]') # (a stream's answers print no run)
  h=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=poll CLAUDE_CODE=1 SHELL_HUNG=1 STREAM=$st) || fail "BashOutput, hung, stream=$st: $h"
  [ "$(echo "$h" | get 'int(d["ended"] == "final" and d["executions"]["BashOutput"] <= 2)')" = 1 ] ||
    fail "BashOutput, hung, stream=$st: a silent build polled without end: $h"
  h=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=poll CLAUDE_CODE=1 SHELL_HUNG=clock STREAM=$st) || fail "BashOutput, hung with a clock, stream=$st: $h"
  [ "$(echo "$h" | get 'int(d["ended"] == "final" and d["executions"]["BashOutput"] <= 3)')" = 1 ] ||
    fail "BashOutput, hung with a clock, stream=$st: a build that says only the time and an id polled without end: $h"
done
[ "$(results "$run" '[x.get("progress_version") for x in r]')" = '[null, 1, 2, 3, 4, 5, 6, 7, 8, null]' ] ||
  fail "BashOutput: the polls' progress_versions: $(results "$run" r)"
# a shell that ended with exit code 1 is a failure (retryable), one that ended with 0 is not
g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=poll CLAUDE_CODE=1 SHELL_EXIT=1) || fail "BashOutput, exit 1: $g"
[ "$(results "$run" 'r[-1]["status"]'),$(results "$(echo "$g" | get 'd["seen"][0]["run"]')" 'r[-1]["status"]')" = '"progress","retryable"' ] ||
  fail "BashOutput: a shell's exit code is not read: $g"

# A built-in tool that succeeds without a word (a patch applied with no
# output, a command that printed nothing: most commands that work) gives a
# value (its status, "[exit 0]"), not a blank one, which stopped the run at
# once (invalid_tool_result, until session 43).
for tool in apply_patch shell; do
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin BUILTIN=$tool SILENT=1) || fail "$tool, silent: $g"
  stopped "$tool, a silent success" "$g"
  echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "$tool, silent: not the model's own end: $g"
done
curl -sf "$gw_URL/v1/runs/$(echo "$g" | get 'd["seen"][0]["run"]')/trace" | grep '"type":"result"' | head -1 |
  grep_q '"status":"progress","value":"\[exit 0\]"' || fail "shell, silent: the result is not the exit status"
# A tool that answers with an image alone (Claude Code's Read of an image
# file, a screenshot tool): its result is the image's digest, not a blank
# value, which stopped the run at once as a tool that answered nothing
# (invalid_tool_result, until session 43); the loop on it is stopped as
# any other, the model giving up in its own words.
for stream in 0 1; do
  note "a tool that answers with an image alone (stream=$stream): a result, the loop stopped"
  g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=loop-write IMAGE=1 STREAM=$stream) || fail "image result, anthropic: $g"
  stopped "image result, anthropic stream=$stream" "$g"
  echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "image result, anthropic: not the model's own end: $g"
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-write IMAGE=1 STREAM=$stream STATELESS=$stream) || fail "image result, responses: $g"
  stopped "image result, responses stream=$stream" "$g"
  echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "image result, responses: not the model's own end: $g"
done
g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=loop-write IMAGE=1) || fail "image result, anthropic: $g"
curl -sf "$gw_URL/v1/runs/$(echo "$g" | get 'd["seen"][0]["run"]')/trace" >"$TMP/image.jsonl" || fail "image result: no trace"
[ "$(grep -c '"type":"result","call_id":"[^"]*","status":"progress","value":"\[image sha256:[0-9a-f]\{16\}\]"' "$TMP/image.jsonl")" = 2 ] ||
  fail "image result: the results are not the image's digest: $(grep '"type":"result"' "$TMP/image.jsonl" | head -c 1000)"
[ "$(grep '"type":"result"' "$TMP/image.jsonl" | sed 's/.*"value":\("[^"]*"\).*/\1/' | sort -u | wc -l)" = 1 ] || fail "image result: the same image, two values"
# a part with content of its own (Anthropic's search_result block): its
# text, then its source's digest
H=(-H 'content-type: application/json' -H 'x-api-key: sk-ant-test' -H 'anthropic-version: 2023-06-01' -H 'X-Loopguard-Run: search-result')
T='[{"name":"write_record","description":"Write a record.","input_schema":{"type":"object"}}]'
curl -sf "${H[@]}" "$gw_URL/v1/messages" -d '{"model":"loop-write","max_tokens":100,"tools":'"$T"',"messages":[{"role":"user","content":"Write record 7."}]}' >"$TMP/sr1.json" ||
  fail "search result: the first request"
asst=$(get '{"role": "assistant", "content": d["content"]}' <"$TMP/sr1.json")
id=$(get '[b["id"] for b in d["content"] if b["type"] == "tool_use"][0]' <"$TMP/sr1.json")
curl -sf "${H[@]}" "$gw_URL/v1/messages" -d '{"model":"loop-write","max_tokens":100,"tools":'"$T"',"messages":[{"role":"user","content":"Write record 7."},'"$asst"',{"role":"user","content":[{"type":"tool_result","tool_use_id":"'"$id"'","content":[{"type":"search_result","source":"https://kb.example/records/7","title":"Record 7","content":[{"type":"text","text":"Record 7 is read-only."}]}]}]}]}' >/dev/null ||
  fail "search result: the second request"
curl -sf "$gw_URL/v1/runs/search-result/trace" | grep '"type":"result"' | grep_q '"value":"Record 7 is read-only.\[search_result sha256:[0-9a-f]\{16\}\]"' ||
  fail "search result: not its text and its source's digest: $(curl -sf "$gw_URL/v1/runs/search-result/trace" | grep '"type":"result"')"
# Anthropic's computer-use tool (type computer_20250124, its calls
# tool_use blocks, its screens images in their tool_result): the same
# screens make the same progress
d=$(client agent-anthropic.mjs BASE_URL="$FAKE" MODEL=loop-click COMPUTER=1) || fail "anthropic computer direct: $d"
[ "$(echo "$d" | get '[d["ended"], d["executions"]["write_record"]]')" = '["step_cap", 12]' ] || fail "anthropic computer direct: $d"
for stream in 0 1; do
  note "Anthropic's computer-use tool (stream=$stream): the same screen stopped, new screens run on, two in turn stopped"
  for screens in same:final:2 new:step_cap:12 toggle:final:4; do
    g=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=loop-click COMPUTER=1 SCREENS=${screens%%:*} STREAM=$stream) || fail "anthropic computer: $g"
    want=${screens#*:}
    [ "$(echo "$g" | get '"%s:%d" % (d["ended"], d["executions"]["write_record"])')" = "$want" ] ||
      fail "anthropic computer, ${screens%%:*} screens, stream=$stream: not $want: $g"
  done
done
# a call's pending safety check acknowledged in the refused call's output
# (the fake refuses an output without it); two calls an answer, the
# computer's and a lookup: each note after both outputs
for st in 0 1; do
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin-checks BUILTIN=computer STATELESS=$st STREAM=$st) || fail "computer checks: $g"
  stopped "computer, safety checks, stateless=$st" "$g"
  g=$(client agent-responses.mjs BASE_URL="$gw_URL/v1" MODEL=loop-builtin-pair BUILTIN=computer STATELESS=$st STREAM=$((1 - st))) || fail "computer pair: $g"
  stopped "computer and a lookup, stateless=$st" "$g"
done
# refused at the first call (this policy blocks at once): the screen is the
# one in the person's message (an image, or a file by its id); with none,
# an image of one blank pixel
echo '{"repeat":{"observe":1,"block":1,"stop":6}}' >"$TMP/block1.json"
start_server gwb1 --store memory: --upstream "$FAKE/v1" --log "$TMP/gwb1.log" --policy "$TMP/block1.json"
tools='[{"type":"computer_use_preview","display_width":1024,"display_height":768,"environment":"browser"}]'
for input in "[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Save the form.\"},{\"type\":\"input_image\",\"image_url\":\"$screen\"}]}]" '"Save the form, at once."' \
  '[{"role":"user","content":[{"type":"input_text","text":"Save the filed form."},{"type":"input_image","file_id":"file-screen-1","detail":"auto"}]}]'; do
  curl -sf "$gwb1_URL/v1/responses" -H 'content-type: application/json' -H 'authorization: Bearer sk-test' \
    -d "{\"model\":\"loop-builtin\",\"tools\":$tools,\"input\":$input}" -o "$TMP/first.json" || fail "computer, first call refused: $(cat "$TMP/first.json")"
done
stats '[sorted(set(i["output"]["image_url"] for b in d["bodies"] if b.get("model") == "loop-builtin" and isinstance(b.get("input"), list) and json.dumps(b["input"][0]).find(t) > 0 for i in b["input"] if i.get("type") == "computer_call_output")) for t in ("Save the form.", "Save the form, at once.")]' >"$TMP/first.screens"
[ "$(get 'd[0] == ["'"$screen"'"] and len(d[1]) == 1 and d[1][0].startswith("data:image/png;base64,iVBOR") and d[1] != d[0]' <"$TMP/first.screens")" = true ] ||
  fail "computer, first call refused: not the person's screen, then a blank one: $(cat "$TMP/first.screens")"
[ "$(stats '[i["output"] for b in d["bodies"] if b.get("model") == "loop-builtin" and isinstance(b.get("input"), list) and json.dumps(b["input"][0]).find("Save the filed form.") > 0 for i in b["input"] if i.get("type") == "computer_call_output"][-1:]')" = '[{"type": "computer_screenshot", "file_id": "file-screen-1"}]' ] ||
  fail "computer, first call refused: not the person's screen by its file id: $(stats '[b["input"] for b in d["bodies"] if "Save the filed form." in json.dumps(b.get("input"))][-1:]')"
stop_server gwb1

note "a custom tool's calls (Chat Completions): guarded, and the hidden tool is the custom one"
d=$(client agent-openai.mjs BASE_URL="$FAKE/v1" MODEL=loop-write CUSTOM=1) || fail "chat custom direct: $d"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "chat custom direct: $d"
g=$(client agent-openai.mjs BASE_URL="$gw_URL/v1" MODEL=loop-write CUSTOM=1 STREAM=raw) || fail "chat custom stream: $g"
stopped "chat custom stream" "$g"
echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "chat custom stream: the custom tool was not hidden: $g"
g=$(client agent-openai.mjs BASE_URL="$gw_URL/v1" MODEL=loop-write CUSTOM=1) || fail "chat custom gateway: $g"
stopped "chat custom" "$g"
# the model gave up in its own words once the tool was hidden (not the stop's message)
echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "chat custom: the custom tool was not hidden: $g"
# first_call_replays LABEL RUN PATTERN: the run's trace holds its first call
# as PATTERN says (grep), and replays to two calls run and one blocked
first_call_replays() {
  curl -sf "$gw_URL/v1/runs/$2/trace" >"$TMP/$2.jsonl" || fail "$1: no trace"
  grep '"type":"call"' "$TMP/$2.jsonl" | head -1 | grep_q "$3" || fail "$1: not $3: $(head -c 2000 "$TMP/$2.jsonl")"
  "$LG_BIN" replay --json "$TMP/$2.jsonl" >"$TMP/$2.replay" || fail "$1: the trace does not replay"
  [ "$(tail -n 1 "$TMP/$2.replay" | get '[d["executed_calls"], d["blocked_calls"]]')" = '[2, 1]' ] ||
    fail "$1: replay: $(tail -n 1 "$TMP/$2.replay")"
}
# the call's args are its input
first_call_replays "chat custom" "$(echo "$g" | get 'd["seen"][0]["run"]')" '"args":{"input":"\*\*\* Begin Patch'

note "legacy function calling (functions, function_call, role function): guarded as tool calls"
d=$(agent BASE_URL="$FAKE/v1" MODEL=loop-write LEGACY=1) || fail "legacy direct: $d"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "legacy direct: $d"
f=$(agent BASE_URL="$gw_URL/v1" MODEL=finish LEGACY=1) || fail "legacy finish: $f"
[ "$(echo "$f" | get 'd["ended"] + str(d["executions"]["lookup"]) + d["final"][:5]')" = final1Done: ] ||
  fail "legacy: an agent that does not loop: $f"
for stream in 1 0; do
  g=$(agent BASE_URL="$gw_URL/v1" MODEL=loop-write LEGACY=1 STREAM=$stream) || fail "legacy stream=$stream: $g"
  stopped "legacy stream=$stream" "$g"
  # the write hidden (the cascade, said as functions): the model gave up in its own words
  echo "$g" | get 'd["final"]' | grep_q '^I could not write the record' || fail "legacy stream=$stream: the function was not hidden: $g"
done
[ "$(echo "$g" | get 'len(set(s["run"] for s in d["seen"]))')" = 1 ] || fail "legacy: one conversation, more than one run: $g"
# the first call named by its place: messages[2], after the system's and the person's
first_call_replays legacy "$(echo "$g" | get 'd["seen"][0]["run"]')" '"call_id":"call_legacy_2"'
# A legacy call has no id, so its conversation is known by its start: the
# first answer's call is part of it. Two conversations with one prompt whose
# first answers call other functions (stubborn's write, finish's lookup;
# neither says a word with it) are two runs, whichever began last.
fns='[{"name":"write_record","parameters":{"type":"object"}},{"name":"lookup","parameters":{"type":"object"}}]'
legacy_turn() { # MODEL MESSAGES: one request, its answer's run -> stdout; the conversation with the answer and its result -> $TMP/lconv.json
  curl -sf -D "$TMP/l.h" -o "$TMP/l.json" -H 'content-type: application/json' -H 'authorization: Bearer sk-test' \
    -d "{\"model\":\"$1\",\"functions\":$fns,\"messages\":$2}" "$gw_URL/v1/chat/completions" || fail "legacy $1: $(cat "$TMP/l.json")"
  get "json.dumps(json.loads(r'''$2''') + [d['choices'][0]['message'], {'role': 'function', 'name': d['choices'][0]['message']['function_call']['name'], 'content': 'Error: no.'}])" \
    <"$TMP/l.json" >"$TMP/lconv.json" || fail "legacy $1: no function_call: $(cat "$TMP/l.json")"
  tr -d '\r' <"$TMP/l.h" | sed -n 's/^[Xx]-[Ll]oopguard-[Rr]un: //p'
}
start='[{"role":"user","content":"Two conversations, one prompt."}]'
run_a=$(legacy_turn stubborn "$start")
conv_a=$(cat "$TMP/lconv.json")
run_b=$(legacy_turn finish "$start")
[ -n "$run_a" ] && [ "$run_a" != "$run_b" ] || fail "legacy: two new conversations, runs '$run_a' and '$run_b'"
[ "$(legacy_turn stubborn "$conv_a")" = "$run_a" ] || fail "legacy: the first conversation's next request went to another run than $run_a"
# A legacy request that forces a function (function_call {"name": F}) or
# none ("none"): read as tool_choice, and sent on in the legacy words
for fc in '{"name":"lookup"}' '"none"'; do
  code=$(curl -s -o "$TMP/l.json" -w '%{http_code}' -H 'content-type: application/json' -H 'authorization: Bearer sk-test' \
    -d "{\"model\":\"finish\",\"functions\":$fns,\"function_call\":$fc,\"messages\":[{\"role\":\"user\",\"content\":\"Forced.\"}]}" \
    "$gw_URL/v1/chat/completions")
  [ "$code" = 200 ] || fail "legacy function_call $fc: $code $(cat "$TMP/l.json")"
  [ "$(stats '(lambda b: [b.get("function_call") == '"$fc"', "tools" in b, "tool_choice" in b, len(b["functions"])])(json.loads(d["raw"][-1]))')" = "[true, false, false, 2]" ] ||
    fail "legacy function_call $fc: the upstream got $(stats 'd["raw"][-1]')"
done
# ... and when the write is hidden (the cascade, after the third write is
# blocked), the re-ask neither lists it nor forces it (a provider refuses
# a function_call naming no function of the request), and a function
# forced that is still there stays forced, in the legacy words
python3 - "$gw_URL" "$FAKE" <<'PY' || fail "legacy function_call, a function hidden"
import json, sys, urllib.request
gw, fake = sys.argv[1], sys.argv[2]
fns = [{"name": "write_record", "parameters": {"type": "object"}}, {"name": "lookup", "parameters": {"type": "object"}}]
for forced, want in (("write_record", None), ("lookup", {"name": "lookup"})):
    msgs = [{"role": "user", "content": "Write record 7 with value A, forced (%s)." % forced}]
    for _ in range(4):
        body = {"model": "stubborn", "functions": fns, "function_call": {"name": forced}, "messages": msgs}
        h = {"content-type": "application/json", "authorization": "Bearer sk-test", "X-Loopguard-Run": "legacy-forced-" + forced}
        with urllib.request.urlopen(urllib.request.Request(gw + "/v1/chat/completions", json.dumps(body).encode(), h)) as r:
            m, act = json.load(r)["choices"][0]["message"], r.headers.get("X-Loopguard-Action")
        if not m.get("function_call"):
            break
        msgs += [m, {"role": "function", "name": m["function_call"]["name"], "content": "Error: the storage is read-only."}]
    with urllib.request.urlopen(fake + "/stats") as r:
        up = json.loads(json.load(r)["raw"][-1])
    names = [f["name"] for f in up.get("functions", [])]
    if act == "execute" or names != ["lookup"] or up.get("function_call") != want or "tools" in up or "tool_choice" in up:
        sys.exit("forced %s: the last answer %s, the re-ask upstream: %s" % (forced, act, json.dumps(up)[:600]))
PY

nruns() { jq_url "$gw_URL/v1/runs?limit=10000" 'len(d["runs"])'; }
# one_session LABEL CMD...: CMD runs one agent session through the gateway
# (its JSON on stdout): it was stopped, and it was one new run
one_session() {
  local label=$1 n0 g
  shift
  n0=$(nruns)
  g=$("$@" 2>"$TMP/session.err") || fail "$label: $g $(cat "$TMP/session.err")"
  stopped "$label" "$g"
  [ "$(($(nruns) - n0))" = 1 ] || fail "$label: $(($(nruns) - n0)) runs for one session"
}
note "the Vercel AI SDK's own loop (ai generateText / streamText, @ai-sdk/openai-compatible; @ai-sdk/openai's Responses)"
d=$(client agent-ai-sdk.mjs BASE_URL="$FAKE/v1" MODEL=loop-write) || fail "ai direct"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "ai direct: $d"
d=$(client agent-ai-sdk.mjs BASE_URL="$FAKE/v1" MODEL=loop-write PROVIDER=openai) || fail "ai direct (openai)"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "ai direct (openai): $d"
for stream in 0 1; do
  for m in loop-write stubborn; do
    g=$(client agent-ai-sdk.mjs BASE_URL="$gw_URL/v1" MODEL=$m STREAM=$stream) || fail "ai gateway $m"
    stopped "ai $m stream=$stream" "$g"
  done
  # @ai-sdk/openai sends its earlier answers back as item_reference items
  # (`store` on): the first answer's items name the run, one a session
  for m in loop-write stubborn pair; do
    one_session "ai (openai) $m stream=$stream" client agent-ai-sdk.mjs BASE_URL="$gw_URL/v1" MODEL=$m STREAM=$stream PROVIDER=openai
  done
  # A reasoning model (the SDK sends `reasoning` for o-series names): in a
  # stream the SDK keeps every reasoning item it saw, the refused answer's
  # too, and sends each back by reference; the turn the gateway restores
  # holds that one, so the upstream must get it once (OpenAI refuses a
  # reasoning item not followed by its own answer's item)
  g=$(client agent-ai-sdk.mjs BASE_URL="$gw_URL/v1" MODEL=o3-detour STREAM=$stream PROVIDER=openai REASONING=1) ||
    fail "ai (openai, reasoning) detour stream=$stream: $g"
  [ "$(echo "$g" | get '[d["executions"]["write_record"], d["executions"]["lookup"], d["ended"]]')" = '[2, 1, "final"]' ] ||
    fail "ai (openai, reasoning) detour stream=$stream: $g"
done
# A client of item references that drops its history's start (keeps only
# the last exchange) still finds its run: every answer's items are keys.
python3 - "$gw_URL" <<'PY' || fail "item references without the history's start: another run"
import json, sys, urllib.request
def ask(inp):
    body = json.dumps({"model": "loop-write", "input": inp, "tools": [{"type": "function", "name": "write_record"}]}).encode()
    r = urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v1/responses", body, {"Content-Type": "application/json"}))
    return r.headers["X-Loopguard-Run"], json.loads(r.read())["output"]
def refs_and_results(out):
    return [{"type": "item_reference", "id": it["id"]} for it in out] + [
        {"type": "function_call_output", "call_id": it["call_id"], "output": "Error: read-only."} for it in out if it["type"] == "function_call"]
first = [{"role": "user", "content": "Write record 7."}]
run1, out1 = ask(first)
run2, out2 = ask(first + refs_and_results(out1))
run3, _ = ask(refs_and_results(out2))  # the start dropped
assert run1 == run2 == run3, (run1, run2, run3)
PY
a=$(client agent-ai-sdk.mjs BASE_URL="$FAKE/v1" MODEL=finish) || fail "ai finish"
b=$(client agent-ai-sdk.mjs BASE_URL="$gw_URL/v1" MODEL=finish) || fail "ai finish"
[ "$(echo "$a" | get 'd["final"]')" = "$(echo "$b" | get 'd["final"]')" ] || fail "ai finish: $a vs $b"

note "the OpenAI Agents SDK's own loop (Runner, maxTurns; Responses API, stateless)"
d=$(client agent-openai-agents.mjs BASE_URL="$FAKE/v1" MODEL=loop-write 2>/dev/null) || fail "agents direct"
[ "$(echo "$d" | get 'd["ended"]')" = step_cap ] || fail "agents direct: $d"
# With reasoning (REASONING=1) each answer starts with a reasoning item,
# to which the fake binds the answer's calls as OpenAI does: a re-ask must
# send it before the call it restores. The SDK names no run: the gateway
# finds each session's run from its first answer, one run a session (an
# answer's text said again by the next session is not its run). pair's
# answers hold two calls, of which the guard keeps the lookup and refuses
# the write: the refused call goes back without its id, bound to nothing.
# With CONVERSATION=1 the SDK runs in a conversation the upstream keeps
# (POST /v1/conversations, then `conversation` on each request, which holds
# only what is new): the conversation names the run, and a refused call is
# answered once in it.
agents() { # NAME=VALUE...: the SDK through the gateway with them: stopped, one run for the session
  one_session "agents $*" client agent-openai-agents.mjs BASE_URL="$gw_URL/v1" "$@"
}
for reasoning in 0 1; do
  for stream in 0 1; do
    for m in loop-write stubborn loop-write pair; do
      agents MODEL=$m STREAM=$stream REASONING=$reasoning
    done
    for m in loop-write stubborn pair; do
      [ $reasoning = 1 ] && agents MODEL=$m STREAM=$stream REASONING=1 CONVERSATION=1
    done
  done
done
# The SDK's own built-in tools (applyPatchTool, shellTool, computerTool):
# their calls are apply_patch_call / shell_call / computer_call items, its
# outputs the SDK's shapes.
for tool in apply_patch shell computer; do
  d=$(client agent-openai-agents.mjs BASE_URL="$FAKE/v1" MODEL=loop-builtin BUILTIN=$tool 2>/dev/null) || fail "agents $tool direct: $d"
  [ "$(echo "$d" | get '[d["ended"], d["executions"]["write_record"]]')" = '["step_cap", 12]' ] || fail "agents $tool direct: $d"
  for stream in 0 1; do
    agents MODEL=loop-builtin BUILTIN=$tool STREAM=$stream
  done
done
note "two agents handing a task back and forth (the Agents SDK's handoffs): the cycle guard ends it"
d=$(client agent-handoffs.mjs BASE_URL="$FAKE/v1" 2>"$TMP/agents.err") || fail "handoffs direct: $(cat "$TMP/agents.err")"
[ "$(echo "$d" | get 'd["ended"]')" = step_cap ] && [ "$(echo "$d" | get 'd["handoffs"]')" = 20 ] || fail "handoffs direct: $d"
g=$(client agent-handoffs.mjs BASE_URL="$gw_URL/v1" 2>"$TMP/agents.err") || fail "handoffs gateway: $(cat "$TMP/agents.err")"
[ "$(echo "$g" | get 'd["ended"]')" = final ] && [ "$(echo "$g" | get 'd["handoffs"]')" -le 4 ] || fail "handoffs gateway: $g"
echo "$g" | get 'd["final"]' | grep_q "same 2 calls" || fail "handoffs gateway: not the cycle's stop: $g"

# A run stopped on a call in a conversation (this policy stops at the third
# same call): the call is in the upstream's conversation, so when the person
# asks again there, the next request answers it (else: "No tool output
# found").
echo '{"repeat":{"observe":2,"block":3,"stop":3},"text":{"repeat":{"observe":false,"stop":1}},"tools":{"write_record":{"loop_key":{"record_id":[],"value":["lower","trim"]}}}}' >"$TMP/gw3-policy.json"
start_server gw3 --store memory: --upstream "$FAKE/v1" --log "$TMP/gw3.log" --policy "$TMP/gw3-policy.json"
g=$(client agent-openai-agents.mjs BASE_URL="$gw3_URL/v1" MODEL=stubborn CONVERSATION=1 AGAIN=1 2>"$TMP/agents.err") ||
  fail "agents in a conversation, asked again after a stop: $g $(cat "$TMP/agents.err")"
echo "$g" | get 'd["again"]' | grep_q "3 times" || fail "asked again after the stop: $g"
grep -q '"event":"stop".*"on":"call"' "$TMP/gw3.log" || fail "the run did not stop on a call: $(cat "$TMP/gw3.log")"
# The same when the run stops on the answer's text (a text loop, this
# policy's stop at the first) beside a call: a whole answer never reaches
# the client, but its call is in the conversation, answered with the stop
# on the next request, and the model goes on ("Done."); a stream is cut at
# the loop, so the conversation holds nothing of it (as OpenAI's keeps
# nothing of a stream its client left), nothing is answered that the
# upstream does not hold, and the model, asked again, chants again; the
# person's first message, lost with the cut request, is sent again before
# the second (the upstream's conversation holds it when not streamed).
for stream in 0 1; do
  g=$(client agent-openai-agents.mjs BASE_URL="$gw3_URL/v1" MODEL=chant-call STREAM=$stream CONVERSATION=1 AGAIN=1 2>"$TMP/agents.err") ||
    fail "agents in a conversation, asked again after a text loop's stop (stream=$stream): $g $(cat "$TMP/agents.err")"
  echo "$g" | get 'd["final"]' | grep_q "repeating the same text" || fail "a text loop's stop in a conversation (stream=$stream): $g"
  if [ $stream = 0 ]; then q='[d["executions"]["lookup"], d["again"]]' w='[0, "Done."]' said='["Then look customer c-1 up instead."]'
  else q='[d["executions"]["lookup"], d["again"] == d["final"]]' w='[0, true]' said='["Write record 7", "Then look customer c-1 up instead."]'; fi
  [ "$(echo "$g" | get "$q")" = "$w" ] || fail "asked again after a text loop's stop (stream=$stream): $g"
  [ "$(stats '[(i["content"] if isinstance(i["content"], str) else i["content"][0]["text"]).split(" with")[0] for i in [b for b in d["bodies"] if b.get("model") == "chant-call"][-1]["input"] if i.get("role") == "user"]')" = "$said" ] ||
    fail "the person's messages the upstream got after a text loop's stop (stream=$stream): $(stats '[b for b in d["bodies"] if b.get("model") == "chant-call"][-1]["input"]')"
done
stop_server gw3
# A stream cut at a text loop (the default policy's observe) whose request
# answered a call: the conversation keeps nothing of that request, its
# answer included, so the gateway answers the call again first in the
# next request; else the conversation holds a call without its output,
# and the upstream refuses every later request ("No tool output found").
g=$(client agent-openai-agents.mjs BASE_URL="$gw_URL/v1" MODEL=call-chant STREAM=1 CONVERSATION=1 AGAIN=1 2>"$TMP/agents.err") ||
  fail "agents in a conversation, asked again after a stream cut at a text loop: $g $(cat "$TMP/agents.err")"
[ "$(echo "$g" | get '[d["executions"]["lookup"], d["final"].count("Waiting for the payment.") < 40, bool(d["again"])]')" = '[1, true, true]' ] ||
  fail "asked again after a stream cut at a text loop: $g"
b=$(client agent-openai-agents.mjs BASE_URL="$gw_URL/v1" MODEL=finish 2>/dev/null) || fail "agents finish"
[ "$(echo "$b" | get 'd["final"]')" = 'Done: {"customer_id":"c-1","name":"Ada"}' ] || fail "agents finish: $b"

note "LangGraph's own loop (createReactAgent, recursionLimit; @langchain/openai ChatOpenAI, Chat Completions and Responses)"
lg() { client agent-langgraph.mjs "$@" 2>"$TMP/langgraph.err" || { cat "$TMP/langgraph.err" >&2; return 1; }; }
for stream in 0 1; do
  d=$(lg BASE_URL="$FAKE/v1" MODEL=loop-write STREAM=$stream STEP_CAP=12) || fail "langgraph direct stream=$stream"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "langgraph direct stream=$stream: $d"
  [ "$(echo "$d" | get 'd["ended"]')" = step_cap ] || fail "langgraph direct stream=$stream: $d"
  for m in loop-write stubborn; do
    g=$(lg BASE_URL="$gw_URL/v1" MODEL=$m STREAM=$stream) || fail "langgraph gateway $m stream=$stream"
    stopped "langgraph $m stream=$stream" "$g"
    [ "$(echo "$g" | get 'd["outside"]')" = "[]" ] || fail "langgraph fetched from outside the machine: $g"
    [ "$stream" = 0 ] || [ "$(echo "$g" | get 'int(d["chunks"] > 0)')" = 1 ] || fail "langgraph $m: no streamed chunk: $g"
  done
  a=$(lg BASE_URL="$FAKE/v1" MODEL=finish STREAM=$stream) || fail "langgraph finish direct"
  b=$(lg BASE_URL="$gw_URL/v1" MODEL=finish STREAM=$stream) || fail "langgraph finish gateway"
  [ "$(echo "$b" | get 'd["ended"]')" = final ] && [ "$(echo "$b" | get 'd["executions"]["lookup"]')" = 1 ] || fail "langgraph finish: $b"
  [ "$(echo "$a" | get 'd["final"]')" = "$(echo "$b" | get 'd["final"]')" ] || fail "langgraph finish: $a vs $b"
  # ChatOpenAI on the Responses API (useResponsesApi): the whole history as items
  for m in loop-write pair; do
    one_session "langgraph responses $m stream=$stream" lg BASE_URL="$gw_URL/v1" MODEL=$m STREAM=$stream RESPONSES=1
  done
done

note "passthrough: GET /v1/models as the upstream sent it"
[ "$(curl -sf "$gw_URL/v1/models")" = "$(curl -sf "$FAKE/v1/models")" ] || fail "models"

note "the upstream never saw a conversation a provider rejects"
v=$(stats 'd["violations"]')
[ "$v" = "[]" ] || fail "violations: $v"

note "bad input: errors in OpenAI's shape, the server keeps serving"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -d '{"model":' "$gw_URL/v1/chat/completions")
[ "$code" = 400 ] || fail "malformed: $code"
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q . || fail "malformed body: $(cat "$TMP/e.json")"
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' -d '{"model":"garbage","messages":[{"role":"user","content":"x"}]}' "$gw_URL/v1/chat/completions")
[ "$code" = 502 ] || fail "garbage: $code $(cat "$TMP/e.json")"
get 'd["error"]["type"]' <"$TMP/e.json" | grep_q upstream || fail "garbage: $(cat "$TMP/e.json")"
start_server down --store memory: --upstream "http://127.0.0.1:9/v1"
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' -d '{"model":"x","messages":[{"role":"user","content":"x"}]}' "$down_URL/v1/chat/completions")
[ "$code" = 502 ] || fail "down: $code"
grep -q "127.0.0.1:9" "$TMP/e.json" || fail "down: the message names no upstream: $(cat "$TMP/e.json")"
# the on-call engineer sees it: counted by kind, and one log line that says why
grep -q '^loopguard_gateway_upstream_errors_total{upstream="default",kind="unreachable"} 1$' <<<"$(curl -sf "$down_URL/metrics")" ||
  fail "down: not counted: $(curl -s "$down_URL/metrics" | grep upstream_errors)"
grep '"event":"upstream_failed"' "$TMP/down.err" | grep '"kind":"unreachable"' | grep_q '"path":"/chat/completions"' ||
  fail "down: no log line: $(cat "$TMP/down.err")"
note "a client whose base URL lacks /v1: its 404 says where the gateway's paths are"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -d '{}' "$gw_URL/chat/completions")
[ "$code" = 404 ] || fail "no /v1: $code"
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q -F "no endpoint POST /chat/completions: the gateway's paths start with /v1 (POST /v1/chat/completions)" ||
  fail "no /v1: $(cat "$TMP/e.json")"
curl -s "$gw_URL/nope" | grep_q '"no endpoint GET /nope"' || fail "a path of no API got the hint: $(curl -s "$gw_URL/nope")"
note "another spelling of a guarded route (a slash doubled or at the end): a 404 in its API's shape, never passed on unguarded"
for p in /v1/chat/completions/ /v1//responses /v1/chat//completions /v1//messages/; do
  code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -H 'authorization: Bearer sk-test' \
    -d '{"model":"finish","messages":[{"role":"user","content":"Hi"}]}' "$gw_URL$p")
  [ "$code" = 404 ] || fail "$p: $code $(cat "$TMP/e.json")"
  get 'd["error"]["message"]' <"$TMP/e.json" | grep_q -F "the gateway guards /v1/" || fail "$p: $(cat "$TMP/e.json")"
  [ "$(stats 'd.get("last_url")')" != "$p" ] || fail "$p: passed through to the upstream"
done
[ "$(get 'd["type"]' <"$TMP/e.json")" = error ] || fail "/v1//messages/: not in Anthropic's shape: $(cat "$TMP/e.json")"
note "an AzureOpenAI client (its deployment paths) with no Azure upstream: its 404 says how to reach Azure through the gateway"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -H 'api-key: k' -d '{}' \
  "$gw_URL/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21")
[ "$code" = 404 ] || fail "azure: $code"
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q -F "no upstream of this gateway is an Azure OpenAI resource; give it the resource as an upstream (--upstream https://RESOURCE.openai.azure.com/openai, or \"api\": \"azure\" in an --upstreams file for another host)" ||
  fail "azure: $(cat "$TMP/e.json")"
note "an AzureOpenAI client (openai's: /openai/deployments/NAME/chat/completions, /openai/responses, ?api-version=, api-key) with an Azure resource as the upstream: stopped as any"
# (the fake's host is not Azure's: "api": "azure" in a file says what the URL cannot)
printf '{"upstreams":{"az":{"base_url":"%s/openai","api":"azure"}}}' "$FAKE" >"$TMP/az.json"
start_server az --store memory: --upstreams "$TMP/az.json" --log "$TMP/az.log"
grep -qF "an Azure OpenAI resource: an AzureOpenAI client's endpoint is the server's URL" "$az_OUT" || fail "azure: the banner: $(cat "$az_OUT")"
d=$(client agent-openai.mjs BASE_URL="$FAKE/v1" MODEL=loop-write AZURE=1) || fail "azure direct: $d"
[ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "azure direct: $d"
n=$(stats 'd["azure"]')
for stream in 0 1; do
  g=$(client agent-openai.mjs BASE_URL="$az_URL/v1" MODEL=loop-write AZURE=1 STREAM=$stream) || fail "azure gateway: $g"
  stopped "azure chat completions stream=$stream" "$g"
done
g=$(client agent-responses.mjs BASE_URL="$az_URL/v1" MODEL=loop-write AZURE=1) || fail "azure responses: $g"
stopped "azure responses" "$g"
# every request reached the fake's Azure paths (which refuse one without api-version or api-key)
[ "$(stats "int(d['azure'] >= $n + 3)")" = 1 ] || fail "azure: the upstream's Azure paths got $(stats 'd["azure"]') requests, from $n"
[ "$(stats 'd["auths"][-1]')" = azure-test-key ] || fail "azure: the client's api-key did not go upstream"
# an OpenAI client whose base URL is the gateway's /openai/v1 (the resource's v1 API under it):
# guarded too, not passed on as any other path; and one whose base URL is the gateway's /v1:
# its requests go to the resource's v1 API (/openai/v1/...), a passed-through one too
for base in "$az_URL/openai/v1" "$az_URL/v1"; do
  g=$(client agent-openai.mjs BASE_URL="$base" MODEL=loop-write) || fail "azure v1 API ($base): $g"
  stopped "the Azure v1 API's chat completions, base URL $base" "$g"
done
# LangGraph on LangChain's AzureChatOpenAI (its azureOpenAIEndpoint the gateway's URL)
d=$(client agent-langgraph.mjs BASE_URL="$FAKE/v1" MODEL=loop-write AZURE=1 STEP_CAP=12) || fail "langgraph azure direct: $d"
[ "$(echo "$d" | get '[d["ended"], d["executions"]["write_record"]]')" = '["step_cap", 12]' ] || fail "langgraph azure direct: $d"
for stream in 0 1; do
  g=$(client agent-langgraph.mjs BASE_URL="$az_URL/v1" MODEL=loop-write AZURE=1 STREAM=$stream) || fail "langgraph azure gateway: $g"
  stopped "langgraph AzureChatOpenAI stream=$stream" "$g"
  [ "$(echo "$g" | get 'd["outside"]')" = "[]" ] || fail "langgraph azure fetched from outside the machine: $g"
done
# the Vercel AI SDK's Azure provider (@ai-sdk/azure), its baseURL the gateway's /openai/v1
for p in azure azure-chat; do
  d=$(client agent-ai-sdk.mjs BASE_URL="$FAKE/v1" MODEL=loop-write PROVIDER=$p) || fail "ai $p direct: $d"
  [ "$(echo "$d" | get 'd["executions"]["write_record"]')" = 12 ] || fail "ai $p direct: $d"
  for stream in 0 1; do
    g=$(client agent-ai-sdk.mjs BASE_URL="$az_URL/v1" MODEL=loop-write PROVIDER=$p STREAM=$stream) || fail "ai $p gateway: $g"
    stopped "ai ($p) stream=$stream" "$g"
  done
done
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sk-test-client' "$az_URL/v1/models")" = 200 ] &&
  [ "$(stats 'd["last_url"]')" = /v1/models ] || fail "azure: GET /v1/models not passed to the resource's v1 API"
stop_server az
note "cascade.escalate on an AzureOpenAI client's deployment path: the escalation's model is the deployment the path names (Azure answers with the path's, not the body's)"
echo '{"cascade":{"escalate":{"model":"stubborn-az-strong","turns":2}}}' >"$TMP/az-esc.json"
start_server azesc --store memory: --upstreams "$TMP/az.json" --policy "$TMP/az-esc.json" --log "$TMP/azesc.log"
g=$(client agent-openai.mjs BASE_URL="$azesc_URL/v1" MODEL=stubborn-az AZURE=1) || fail "azure escalation: $g"
[ "$(echo "$g" | get 'd["ended"]')" = final ] || fail "azure escalation: $g"
# the models the fake's Azure paths answered with: each the path's deployment
models=$(stats '[m for m in d["models"] if m.startswith("stubborn-az")]')
echo "$models" | grep -qF '"stubborn-az-strong"' || fail "azure escalation: no call reached the escalation's deployment: $models"
[ "$(echo "$models" | get 'd[0]')" = stubborn-az ] || fail "azure escalation: the first call was escalated: $models"
stop_server azesc
note "an OpenAI-compatible API whose base URL ends in /openai, not on Azure's hosts (Gemini's): OpenAI's paths and key, no Azure routes"
start_server gem --store memory: --upstream "$FAKE/v1beta/openai" --log "$TMP/gem.log"
grep -qF "Azure" "$gem_OUT" && fail "gemini-style upstream named an Azure resource: $(cat "$gem_OUT")"
n=$(stats 'd["compat"]')
g=$(client agent-openai.mjs BASE_URL="$gem_URL/v1" MODEL=loop-write) || fail "gemini-style upstream: $g"
stopped "an OpenAI-compatible upstream under /v1beta/openai" "$g"
[ "$(stats "int(d['compat'] > $n)")" = 1 ] || fail "gemini-style upstream: no request reached its paths"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'api-key: k' -d '{}' "$gem_URL/openai/deployments/x/chat/completions?api-version=1")" = 404 ] ||
  fail "gemini-style upstream: an Azure path was taken"
stop_server gem
note "beside an OpenAI default, an /openai/ request goes to the Azure upstream (never its api-key to another provider), a /v1 one to the default"
printf '{"upstreams":{"openai":{"base_url":"%s/v1"},"az":{"base_url":"%s/openai","api":"azure"}},"default":"openai","routes":[{"model_prefix":"fin","upstream":"openai"}]}' \
  "$FAKE" "$FAKE" >"$TMP/two.json"
start_server two --store memory: --upstreams "$TMP/two.json"
n=$(stats 'd["azure"]')
# the fake's Azure paths count what reaches them (a deployment's chat completions, guarded; its embeddings, passed through)
for pc in "/openai/deployments/finish/chat/completions?api-version=2024-10-21 200" "/openai/deployments/finish/embeddings?api-version=2024-10-21 200"; do
  code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -H 'api-key: azure-test-key' \
    -d '{"model":"finish","messages":[{"role":"user","content":"Hi"}],"input":"x"}' "$two_URL${pc% *}")
  [ "$code" = "${pc#* }" ] || fail "two upstreams, ${pc% *}: $code $(cat "$TMP/e.json")"
done
[ "$(stats "d['azure'] - $n")" = 2 ] || fail "two upstreams: the Azure paths got $(stats "d['azure'] - $n") of 2"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' -H 'Authorization: Bearer sk-test' \
  -d '{"model":"finish","messages":[{"role":"user","content":"Hi"}]}' "$two_URL/v1/chat/completions")
[ "$code" = 200 ] && [ "$(stats 'd["last_url"]')" = /v1/chat/completions ] ||
  fail "two upstreams, /v1: $code, to $(stats 'd["last_url"]')"
stop_server two
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -H 'x-api-key: sk-test' -d '{}' "$gw_URL/v1/v1/messages")
[ "$code" = 404 ] || fail "/v1 twice: $code"
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q -F "/v1 is in the client's base URL twice" || fail "/v1 twice: $(cat "$TMP/e.json")"
[ "$(get 'd["type"]' <"$TMP/e.json")" = error ] || fail "/v1 twice: not in Anthropic's shape: $(cat "$TMP/e.json")"
[ "$(stats 'd.get("last_url")')" != /v1/v1/messages ] || fail "/v1 twice: passed through to the upstream"
note "a base URL without a path (every request the provider's 404) is said at the start, in the banner and the log"
printf '{"upstreams":{"o":{"base_url":"%s","api":"openai"},"a":{"base_url":"%s/","api":"anthropic"}},"default":"o"}' \
  "$FAKE" "$FAKE" >"$TMP/nopath.json"
start_server nopath --store memory: --upstreams "$TMP/nopath.json"
for i in $(seq 40); do [ "$(grep -c "note:" "$nopath_OUT")" = 2 ] && break; sleep 0.05; done
grep -qF "gateway: note: $FAKE has no path, so requests go to $FAKE/chat/completions; a provider's base URL ends in its path (https://api.openai.com/v1)" "$nopath_OUT" ||
  fail "no path: the banner says nothing: $(cat "$nopath_OUT")"
grep -qF "$FAKE/messages; a provider's base URL ends in its path (https://api.anthropic.com/v1)" "$nopath_OUT" ||
  fail "no path (anthropic): $(cat "$nopath_OUT")"
[ "$(grep -c '"event":"upstream_without_path"' "$TMP/nopath.err")" = 2 ] || fail "no path: the log: $(cat "$TMP/nopath.err")"
grep -q "note:" "$gw_OUT" "$down_OUT" && fail "a note under a base URL with its path: $(cat "$gw_OUT" "$down_OUT")"
grep -q '"upstream_without_path"' "$TMP/gw.log" "$TMP/down.err" && fail "a warning for a base URL with its path"
stop_server nopath
note "an outage: every failure counted, one log line a second for an upstream and kind, the next saying how many it left out"
t0=$(date +%s.%N)
for i in $(seq 20); do
  curl -s -o /dev/null -H "Content-Type: application/json" -d '{"model":"x","messages":[{"role":"user","content":"x"}]}' \
    "$down_URL/v1/chat/completions"
done
burst=$(python3 -c "print(int($(date +%s.%N) - $t0))")
sleep 1.1
curl -s -o /dev/null -H "Content-Type: application/json" -d '{"model":"x","messages":[{"role":"user","content":"x"}]}' \
  "$down_URL/v1/chat/completions"
grep -q '^loopguard_gateway_upstream_errors_total{upstream="default",kind="unreachable"} 22$' <<<"$(curl -sf "$down_URL/metrics")" ||
  fail "outage: not all counted: $(curl -s "$down_URL/metrics" | grep upstream_errors)"
grep '"event":"upstream_failed"' "$TMP/down.err" >"$TMP/down.lines"
r=$(python3 -c '
import json, sys
ls = [json.loads(l) for l in open(sys.argv[1])]
print(len(ls), sum(l.get("suppressed", 0) for l in ls))' "$TMP/down.lines")
read -r lines left <<<"$r"
# at most one line a second (the one before the burst, those of the burst, the one after
# the pause, and a margin for a slow machine); every failure a line or counted as left out
# by a later line (which one depends on the burst's pace: under ASan it can pass a second)
((lines <= burst + 4 && lines + left == 22 && left >= 1)) ||
  fail "outage: $lines lines (a burst of $burst s), $left left out, for 22 failures; the last two: $(tail -n 2 "$TMP/down.lines")"
curl -sf "$gw_URL/healthz" >/dev/null || fail "the server stopped serving"
curl -sf "$gw_URL/metrics" >"$TMP/metrics.txt" || fail "metrics"
grep -q 'loopguard_gateway_interventions_total{action="block",reason="same_call_repeat"}' "$TMP/metrics.txt" || { grep gateway "$TMP/metrics.txt"; fail "metrics"; }
# Every run above kept restored calls and Responses answers: copies of their own, so the
# chunks that held the requests and answers they came from went back: one open a thread
# that reads JSON at most (the HTTP threads, the workers: the pool grows when requests
# wait, as on a busy machine; the committer, which reads results late), one in flight.
chunks=$(awk '$1 == "loopguard_gateway_json_chunks" { print $2 }' "$TMP/metrics.txt")
workers=$(awk '$1 ~ /^loopguard_gateway_workers\{/ { n += $2 } END { print n + 0 }' "$TMP/metrics.txt")
loops=$(sed -n 's/^  threads: \([0-9]*\),.*/\1/p' "$gw_OUT")
[ -n "$loops" ] && [ "$workers" -ge 1 ] || fail "no threads or workers to bound the chunks by: $loops, $workers"
[ -n "$chunks" ] && [ "$chunks" -le $((loops + workers + 2)) ] ||
  fail "JSON chunks held after the runs: ${chunks:-none} for $loops HTTP threads and $workers workers (values kept past their request)"

note "an unknown /v1/ path: the upstream's own 404, as it sent it"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "$gw_URL/v1/nothing/here")
[ "$code" = 404 ] && grep -q unknown_url "$TMP/e.json" || fail "unknown path: $code $(cat "$TMP/e.json")"
n=$(curl -sf "$gw_URL/metrics" | awk '$1 == "loopguard_gateway_upstream_errors_total{upstream=\"default\",kind=\"http_4xx\"}" { print $2 }')
[ "${n:-0}" -ge 1 ] || fail "the upstream's 404 not counted as http_4xx (${n:-none})"

note "a run's caps are decided before the request leaves: the final message, no upstream call"
echo '{"limits":{"max_model_calls":2}}' >"$TMP/cap.json"
cat >"$TMP/ups.json" <<JSON
{"upstreams": {"fake": {"base_url": "$FAKE/v1", "api": "openai", "timeout_ms": 1000}}, "default": "fake"}
JSON
start_server cap --store memory: --upstreams "$TMP/ups.json" --policy "$TMP/cap.json" --gateway-max-body 1048576
before=$(stats 'd["chat"]')
c=$(agent BASE_URL="$cap_URL/v1" MODEL=stubborn) || fail "agent (cap)"
after=$(stats 'd["chat"]')
[ $((after - before)) = 2 ] || fail "cap: the upstream got $((after - before)) requests: $c"
[ "$(echo "$c" | get 'd["ended"]')" = final ] || fail "cap: $c"
echo "$c" | get '[s["reason"] for s in d["seen"]]' | grep_q model_call_cap || fail "cap: no model_call_cap: $c"

note "an upstream that times out: 504 in OpenAI's shape"
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' -d '{"model":"slow","messages":[{"role":"user","content":"x"}]}' "$cap_URL/v1/chat/completions")
[ "$code" = 504 ] && grep -q fake "$TMP/e.json" || fail "slow: $code $(cat "$TMP/e.json")"
grep -q '^loopguard_gateway_upstream_errors_total{upstream="fake",kind="timeout"} 1$' <<<"$(curl -sf "$cap_URL/metrics")" ||
  fail "slow: the timeout not counted: $(curl -s "$cap_URL/metrics" | grep upstream_errors)"

note "a body over the limit (--gateway-max-body 1 MiB), sent chunked: 413 with an error message; the server keeps serving"
head -c 1100000 /dev/zero | tr '\0' a >"$TMP/big.txt"
code=$(curl -s -H "Content-Type: application/json" -H 'Transfer-Encoding: chunked' -o "$TMP/e.json" -w '%{http_code}' --data-binary @"$TMP/big.txt" "$cap_URL/v1/chat/completions")
[ "$code" = 413 ] && get 'd["error"]["message"]' <"$TMP/e.json" | grep_q 'limit of 1048576 bytes (loopguard serve --gateway-max-body)' ||
  fail "too big: $code $(cat "$TMP/e.json")"
curl -sf "$cap_URL/healthz" >/dev/null || fail "the server stopped serving after a 413"

note "an upstreams file with a mistake: the start fails, naming the field"
echo '{"upstreams":{"x":{"base_url":"http://127.0.0.1:1/v1","timeout_ms":"soon"}}}' >"$TMP/bad.json"
if "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstreams "$TMP/bad.json" >"$TMP/bad.out" 2>&1; then
  fail "a bad upstreams file started"
fi
grep -q "upstreams.x.timeout_ms" "$TMP/bad.out" || fail "bad upstreams: $(cat "$TMP/bad.out")"

# and since the check above, the Azure clients', the escalation's, the rest's
fakes_clean
stop_server cap
stop_server down
stop_server gw
echo "PASS"
