#!/usr/bin/env bash
# guard.sh — the gateway's guards beyond tool calls (gateway-v1, ctest
# gateway_guard), against the fake upstream (fake-upstream.mjs) with the
# real SDKs (agent-guard.mjs) and plain fetch (conversation.mjs):
#   - text loops: a chanting model is cut in the middle of its stream (the
#     upstream request aborted), the stop reaches the client as a normal
#     final answer in each API's stream shape, and the run's trace replays
#     to the same decisions; not streamed, the stop replaces the answer;
#     a monologue (the same words answer after answer) stops the run;
#   - a new user message after a loop's stop resumes the run (a new
#     episode), after a cap's it does not;
#   - the cascade: ask_human / finalize_partial offered and ending the run,
#     escalate_model sending the next calls to another model, the cascade
#     fields in the sidecar's decisions; gateway.final_round;
#   - a coding agent's edit/test cycle: stopped by the default policy,
#     run to the end with examples/policies/coding-agent.json;
#   - X-Loopguard-Policy (--policies DIR), an unknown name a 400; an
#     X-Loopguard-Run that is no run id a 400;
#   - writes (side_effects): two of one answer run once; one that
#     succeeded and is asked again is replayed, its saved result given
#     to the model, the call never reaching the client;
#   - a client's retry of its last request answered again, not re-asked;
#   - the observe rung's note on a result of several parts (an image kept);
#     a text loop's steer note said once, on the next request;
#   - errors in each API's shape: 413, 401, a stream of garbage, a stream
#     cut off by the upstream, an upstream that is down, an answer past
#     LOOPGUARD_GATEWAY_ANSWER_BYTES (whole, or one stream event), a re-ask
#     the gateway refuses after the stream began (an error event, never the
#     refused call); an answer cut off by max_tokens keeps saying so; a
#     client that hangs up aborts the upstream request; the server keeps
#     serving;
#   - an Anthropic message of tool results and a text: results, then user;
#   - runs evicted from memory past LOOPGUARD_GATEWAY_MAX_RUNS;
#   - a SQLite store whose write lock another process holds when an answer
#     arrives: its usage and text decided again a step at a time, nothing
#     lost;
#   - a slow upstream awaited on the loop (health, metrics and another
#     request answered meanwhile), and 20 slow requests at once answered
#     together: the worker pool grows, up to LOOPGUARD_GATEWAY_WORKERS.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the clients, the fake upstream: HERE, FAKE

get() { jq_py "$1"; }
guard() { # ENV... : runs agent-guard.mjs, prints its JSON
  client agent-guard.mjs "$@"
}
base_of() { [ "$1" = messages ] && echo "$g_URL" || echo "$g_URL/v1"; }
# on_api RUN API STREAM POLICY ENV...: agent-guard.mjs on one API through
# the gateway, its run named RUN and given the named POLICY, which must end
# on a final message; its JSON in $out
on_api() {
  local run=$1 api=$2 st=$3 pol=$4
  shift 4
  out=$(guard API="$api" BASE_URL="$(base_of "$api")" STREAM="$st" "$@" \
    HEADERS="{\"X-Loopguard-Policy\":\"$pol\",\"X-Loopguard-Run\":\"$run\"}") || fail "$run: $out"
  [ "$(echo "$out" | get 'd["ended"]')" = final ] || fail "$run: not ended by a final message: $out"
}

mkdir -p "$TMP/policies"
echo '{"text":{"repeat":{"observe":false,"stop":1}}}' >"$TMP/policies/chant.json"
echo '{"cascade":{"offer":["ask_human","finalize_partial"]}}' >"$TMP/policies/offer.json"
echo '{"cascade":{"escalate":{"model":"stubborn-strong","turns":2}}}' >"$TMP/policies/escalate.json"
echo '{"gateway":{"final_round":true}}' >"$TMP/policies/final.json"
echo '{"limits":{"max_model_calls":3}}' >"$TMP/policies/cap3.json"
echo '{"tools":{"write_record":{"side_effects":true}}}' >"$TMP/policies/writes.json"
echo '{"cascade":{"hide_turns":0}}' >"$TMP/policies/nohide.json"
echo 'not a policy' >"$TMP/policies/README.txt" # not NAME.json: skipped
cp "$HERE_SRC/../../examples/policies/coding-agent.json" "$TMP/policies/" # the shipped recipe, as it is
start_server g --store memory: --upstream "$FAKE/v1" --log "$TMP/g.log" --policies "$TMP/policies"

note "the server's threads carry their names (docs/server.md, \"Signals and life\")"
names=$(cat /proc/"$g_PID"/task/*/comm | sort -u | tr '\n' ' ')
for t in lg-http lg-commit lg-gateway lg-gw-grow lg-reaper; do
  [[ " $names" == *" $t "* ]] || fail "no thread named $t: $names"
done

note "a text loop in a stream (each API): cut, the stop as the final answer, the upstream aborted"
for api in chat messages responses; do
  before=$(stats 'd["aborted"]')
  run="chant-$api"
  on_api "$run" $api 1 chant MODEL=chant
  echo "$out" | get 'd["final"]' | grep_q "repeating the same text" || fail "chant $api: no stop message: $out"
  [ "$(echo "$out" | get 'd["finish"]')" = "$(case $api in chat) echo stop ;; messages) echo end_turn ;; *) echo completed ;; esac)" ] ||
    fail "chant $api: the stream did not finish normally: $out"
  [ "$(echo "$out" | get 'int(d["final"].count("Waiting for the payment.") < 40)')" = 1 ] || fail "chant $api: not cut: $out"
  # Responses: the stop's message item built from its events once (its
  # output_item.added with no content, as the API sends one; earlier
  # builds sent the text there and again as a delta: the SDK showed it twice)
  [ $api != responses ] || [ "$(echo "$out" | get 'd["snapshot"] == d["final"]')" = true ] ||
    fail "chant $api: the stream's text as the SDK built it is not the stop's message: $out"
  # the cut answer's output, counted from its bytes, in the stop's usage
  [ "$(echo "$out" | get 'int((d["usage"] or {}).get("completion_tokens", (d["usage"] or {}).get("output_tokens", 0)) > 0)')" = 1 ] ||
    fail "chant $api: the stop's usage counts nothing of the cut answer: $out"
  for i in $(seq 50); do [ "$(stats 'd["aborted"]')" -gt "$before" ] && break; sleep 0.1; done
  [ "$(stats 'd["aborted"]')" -gt "$before" ] || fail "chant $api: the upstream request was not aborted"
  note "its trace replays to the same decisions ($api)"
  curl -sf "$g_URL/v1/runs/$run/trace" >"$TMP/$run.jsonl" || fail "trace $run"
  grep -q '"type":"text"' "$TMP/$run.jsonl" || fail "no text line in the trace: $(cat "$TMP/$run.jsonl")"
  "$LG_BIN" replay --json "$TMP/$run.jsonl" >"$TMP/$run.replay" || fail "replay $run"
  [ "$(tail -n 1 "$TMP/$run.replay" | get 'd["terminal_reason"]')" = text_repeat ] || fail "replay $run: $(tail -n 1 "$TMP/$run.replay")"
  [ "$(jq_url "$g_URL/v1/runs/$run" 'd["terminal_reason"]')" = text_repeat ] || fail "run $run"
  grep -q '"type":"text","action":"stop","reason":"text_repeat"' "$TMP/$run.replay" || fail "replay $run: no text stop: $(cat "$TMP/$run.replay")"
done

note "a text loop, not streamed: the stop replaces the looping answer"
out=$(guard BASE_URL="$g_URL/v1" MODEL=chant HEADERS='{"X-Loopguard-Policy":"chant"}') || fail "chant plain: $out"
echo "$out" | get 'd["final"]' | grep_q "^I have fallen into repeating the same text" || fail "chant plain: $out"
echo "$out" | get 'd["final"]' | grep_q "Waiting" && fail "chant plain: the loop reached the client: $out"
[ "$(echo "$out" | get 'd["seen"][0]["action"]')" = stop ] || fail "chant plain: $out"

note "a monologue (the same words with a write the guard blocks, answer after answer, asked again): the run stops with monologue, each API, stream and not; its trace replays to it"
# detour says "Writing the record." with each write; with the write never
# hidden, the blocked ones are asked again, and the third answer in a row
# with the same text and no executed call between is the monologue. In a
# stream it is known only at the answer's end.
for api in chat messages responses functions; do
  for st in 0 1; do
    run="monologue-$api-$st"
    on_api "$run" $api $st nohide MODEL=detour
    echo "$out" | get 'd["final"]' | grep_q "I have written the same thing 3 turns in a row" || fail "monologue $api $st: not the stop's message: $out"
    [ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 2 ] || fail "monologue $api $st: $out"
    [ "$(jq_url "$g_URL/v1/runs/$run" 'd["terminal_reason"]')" = monologue ] || fail "monologue $api $st: the run: $(curl -s "$g_URL/v1/runs/$run")"
  done
  curl -sf "$g_URL/v1/runs/$run/trace" >"$TMP/$run.jsonl" || fail "trace $run"
  "$LG_BIN" replay --json "$TMP/$run.jsonl" >"$TMP/$run.replay" || fail "replay $run"
  [ "$(tail -n 1 "$TMP/$run.replay" | get 'd["terminal_reason"]')" = monologue ] || fail "replay $run: $(tail -n 1 "$TMP/$run.replay")"
done

note "a text loop under the default policy (observe): the stream cut, a normal end, no stop; the client told the usage its run was charged"
for api in chat messages responses; do
  run="chant-observe-$api"
  out=$(guard API=$api BASE_URL="$(base_of $api)" MODEL=chant STREAM=1 HEADERS="{\"X-Loopguard-Run\":\"$run\"}") ||
    fail "chant observe $api: $out"
  charged=$(curl -sf "$g_URL/v1/runs/$run/trace" | grep '"type":"usage"' | get '[d["input_tokens"], d["output_tokens"]]')
  # what the SDK read: Chat Completions' usage chunk, Responses' usage,
  # Messages' message_start input (its cache tokens counted as input) and
  # message_delta output
  told=$(echo "$out" | get '(lambda u: [u.get("prompt_tokens", u.get("input_tokens", 0)) + u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0), u.get("completion_tokens", u.get("output_tokens", 0))])(d["usage"] or {})')
  [ -n "$charged" ] && [ "$told" = "$charged" ] || fail "chant observe $api: the client was told usage $told, the run charged $charged: $out"
  [ "$(echo "$told" | get 'int(d[1] > 0)')" = 1 ] || fail "chant observe $api: no output counted: $out"
  [ "$(echo "$out" | get 'd["ended"]')" = final ] || fail "chant observe $api: $out"
  [ "$(echo "$out" | get 'd["finish"]')" = "$(case $api in chat) echo stop ;; messages) echo end_turn ;; *) echo completed ;; esac)" ] ||
    fail "chant observe $api: the stream did not finish normally: $out"
  [ "$(echo "$out" | get 'int(0 < d["final"].count("Waiting for the payment.") < 40)')" = 1 ] || fail "chant observe $api: not cut: $out"
  echo "$out" | get 'd["final"]' | grep_q "stopping" && fail "chant observe $api: stopped: $out"
done
# The text a cut Responses stream closes its message with is the text the
# client got, delta by delta: the delta that made the cut is read by the
# run, not sent (until session 41 output_text.done and the completed
# response held it, 8 characters the deltas never had).
python3 - "$g_URL" <<'PY' || fail "chant observe responses: the closing text is not the deltas' text"
import json, sys, urllib.request
body = json.dumps({"model": "chant", "stream": True, "input": "Wait for the payment."}).encode()
req = urllib.request.Request(sys.argv[1] + "/v1/responses", body, {"Content-Type": "application/json", "X-Loopguard-Run": "chant-cut-text"})
evs = [json.loads(l[6:]) for l in urllib.request.urlopen(req).read().decode().split("\n") if l.startswith("data: ")]
deltas = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
done = [e["text"] for e in evs if e["type"] == "response.output_text.done"]
last = [e["response"] for e in evs if e["type"] in ("response.completed", "response.incomplete")][-1]
told = "".join(p.get("text", "") for it in last["output"] for p in it.get("content", []) if p.get("type") == "output_text")
assert 0 < len(deltas) < 5000 and done == [deltas] and told == deltas, (len(deltas), [len(d) for d in done], len(told))
PY

note "a new user message after a loop's stop: the run resumes, a new episode, and its trace replays to that"
active() { curl -sf "$g_URL/metrics" | awk '$1 == "loopguard_runs_active" { print $2 }'; }
a0=$(active)
e=$(client conversation.mjs MODE=episode MODEL=stubborn MODEL2=finish BASE_URL="$g_URL/v1") || fail "episode: $e"
# made (+1), stopped (-1), resumed (+1): active again, as the HTTP API's
# resume counts it (until session 41 the gateway's copy of that rule
# counted the stop and not the resume)
[ "$(active)" = "$((a0 + 1))" ] || fail "episode: runs_active $(active) after a run made, stopped and resumed, wanted $((a0 + 1))"
[ "$(echo "$e" | get 'd["first"]["action"]')" = stop ] || fail "episode: $e"
[ "$(echo "$e" | get 'd["first"]["run"] == d["second"]["run"]')" = true ] || fail "episode: another run: $e"
[ "$(echo "$e" | get 'd["second"]["action"]')" = pass ] || fail "episode: $e"
echo "$e" | get 'd["second"]["text"]' | grep_q "^Done" || fail "episode: $e"
r1=$(echo "$e" | get 'd["first"]["run"]')
[ "$(jq_url "$g_URL/v1/runs/$r1" 'd["status"]')" = active ] || fail "episode: $r1 did not resume"
curl -sf "$g_URL/v1/runs/$r1/trace" >"$TMP/episode.jsonl" || fail "trace $r1"
grep -q '"type":"resume"' "$TMP/episode.jsonl" && grep -q '"type":"user"' "$TMP/episode.jsonl" || fail "episode trace: $(cat "$TMP/episode.jsonl")"
"$LG_BIN" replay --json "$TMP/episode.jsonl" >"$TMP/episode.replay" || fail "replay $r1"
[ "$(tail -n 1 "$TMP/episode.replay" | get 'd["terminal_reason"]')" = null ] || fail "episode replay: $(tail -n 1 "$TMP/episode.replay")"
note "an operator resumes a stopped run: the conversation's next request goes on, not the stop's message again"
# The gateway's memory of the stop's message is not the run's state: a
# resume event (POST /v1/runs/{id}/resume, or another replica's) goes on.
e=$(client conversation.mjs MODE=resume MODEL=stubborn MODEL2=finish BASE_URL="$g_URL/v1") || fail "resume: $e"
[ "$(echo "$e" | get 'd["first"]["action"]')" = stop ] && [ "$(echo "$e" | get 'd["resumed"]')" = 200 ] || fail "resume: $e"
[ "$(echo "$e" | get 'd["second"]["action"]')" != stop ] || fail "resume: the stop's message again after the operator's resume: $e"
[ "$(echo "$e" | get 'd["first"]["run"] == d["second"]["run"]')" = true ] || fail "resume: another run: $e"
note "a new user message after a cap's stop: still stopped (caps carry on across episodes)"
e=$(client conversation.mjs MODE=episode MODEL=stubborn MODEL2=finish BASE_URL="$g_URL/v1" HEADERS='{"X-Loopguard-Policy":"cap3","X-Loopguard-Run":"capped"}') || fail "capped episode: $e"
[ "$(echo "$e" | get 'd["second"]["run"]')" = capped ] && [ "$(echo "$e" | get 'd["second"]["action"]')" = stop ] || fail "capped episode: $e"
[ "$(echo "$e" | get 'd["second"]["text"] == d["first"]["text"]')" = true ] || fail "capped episode: $e"
[ "$(jq_url "$g_URL/v1/runs/capped" 'd["terminal_reason"]')" = model_call_cap ] || fail "capped: not a cap"

note "cascade.offer: the model asks a person (ask_human) or finishes (finalize_partial)"
for api in chat messages responses functions; do
  for stream in 0 1; do
    run="ask-$api-$stream"
    on_api "$run" $api $stream offer MODEL=ask
    [ "$(echo "$out" | get 'd["final"]')" = "The storage is read-only: may I write somewhere else?" ] || fail "ask $api $stream: $out"
    [ "$(echo "$out" | get 'd["executions"]["write_record"]')" -le 2 ] || fail "ask $api $stream: $out"
    env=$(curl -sf "$g_URL/v1/runs/$run") || fail "run $run"
    [ "$(echo "$env" | get 'd["terminal_reason"]')" = human_required ] || fail "ask $api $stream: $env"
    echo "$env" | get 'd["envelope"]["question"]' | grep_q "may I write somewhere else" || fail "ask $api $stream: no question: $env"
  done
done
out=$(guard BASE_URL="$g_URL/v1" MODEL=finalize HEADERS='{"X-Loopguard-Policy":"offer","X-Loopguard-Run":"fin-1"}') || fail "finalize: $out"
[ "$(echo "$out" | get 'd["final"]')" = "Record 7 is not written: the storage is read-only." ] || fail "finalize: $out"
[ "$(jq_url "$g_URL/v1/runs/fin-1" 'd["terminal_reason"]')" = complete ] || fail "finalize: not complete"
note "without the offer, the same model is stopped by the loop guard"
out=$(guard BASE_URL="$g_URL/v1" MODEL=ask HEADERS='{"X-Loopguard-Run":"ask-none"}') || fail "ask (no offer): $out"
[ "$(jq_url "$g_URL/v1/runs/ask-none" 'd["terminal_reason"]')" != human_required ] || fail "ask (no offer): offered anyway"
echo "$out" | get 'd["final"]' | grep_q "may I write" && fail "ask (no offer): $out"

note "the same write twice in one answer (parallel calls): with side_effects, run once, the second answered in_progress; without, run twice (trace-v1)"
for api in chat messages responses; do
  st=$([ $api = messages ] && echo 0 || echo 1)
  out=$(guard API=$api BASE_URL="$(base_of $api)" MODEL=twin STREAM=$st HEADERS='{"X-Loopguard-Policy":"writes"}') || fail "twin $api: $out"
  [ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 1 ] || fail "twin $api: the write ran more than once: $out"
  [ "$(echo "$out" | get 'd["ended"]')" = final ] || fail "twin $api: $out"
  echo "$out" | get 'd["final"]' | grep_q "did not run this call (in_progress)" || fail "twin $api: the model was not told: $out"
done
out=$(guard MODEL=twin BASE_URL="$g_URL/v1") || fail "twin (no side_effects): $out"
[ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 2 ] || fail "twin (no side_effects): $out"
# three in one streamed answer with text (the text's step settles the
# usage, the calls are decided after it): run once, and under ASan the
# server still exits 0 at the end (before session 38 the array of three
# steps or more decided without the usage was not freed: fuzz_gateway
# found the leak)
out=$(guard MODEL=twin3 BASE_URL="$g_URL/v1" STREAM=1 HEADERS='{"X-Loopguard-Policy":"writes"}') || fail "twin3: $out"
[ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 1 ] && [ "$(echo "$out" | get 'd["ended"]')" = final ] ||
  fail "twin3: $out"

note "a committed write asked again: replayed (its saved result to the model, the call never reaching the client), each API"
# The write succeeds; the model asks for it again and again. With
# side_effects the ledger has its result: each later ask is answered with
# it upstream, the client runs it once, and the replays end in a stop.
for v in chat:0 chat:1 messages:1 responses:0 responses:1; do
  api=${v%:*} st=${v#*:}
  out=$(guard API=$api BASE_URL="$(base_of $api)" MODEL=stubborn STREAM=$st WRITE_OK=1 HEADERS='{"X-Loopguard-Policy":"writes"}') || fail "replay $v: $out"
  [ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 1 ] || fail "replay $v: the write ran more than once: $out"
  [ "$(echo "$out" | get 'd["ended"]')" = final ] || fail "replay $v: $out"
  # the upstream got the saved result for the asks after the first (its
  # last request as it came, whatever the API)
  n=$(stats 'd["raw"][-1].count("Wrote record 7.")')
  [ "$n" -ge 2 ] || fail "replay $v: the upstream's last request holds $n results of the write (the client ran it once): the saved result was not given"
done
grep '"event":"gateway_intervention"' "$TMP/g.log" | grep '"action":"replay"' | grep_q '"reason":"already_committed"' ||
  fail "replay: no intervention line with the action replay in the log"

note "the observe rung's note on a tool result given as a list of parts (a text and a screenshot): every part kept, the note a text part of the API's own type (each API)"
python3 "$HERE_SRC/steer-parts.py" "$g_URL" "$FAKE" || fail "the note on a result of several parts"
note "a text loop's steer note (the observe rung): given to the model on the next request once, on its last message that can carry it (each API; Responses whole, by previous_response_id, after the gateway's own answer)"
python3 "$HERE_SRC/text-steer.py" "$g_URL" "$FAKE" || fail "a text loop's steer note"

note "cascade.escalate: after a block, the next model calls go to the escalation's model"
curl -sf -X POST "$FAKE/reset" >/dev/null
out=$(guard BASE_URL="$g_URL/v1" MODEL=stubborn HEADERS='{"X-Loopguard-Policy":"escalate"}') || fail "escalate: $out"
[ "$(echo "$out" | get 'd["ended"]')" = final ] || fail "escalate: $out"
models=$(stats 'd["models"]')
echo "$models" | grep >/dev/null "stubborn-strong" || fail "escalate: the upstream never got the escalated model: $models"
[ "$(echo "$models" | get 'd[0]')" = stubborn ] || fail "escalate: the first call was escalated: $models"

note "a re-ask the gateway itself refuses after the client's stream began (its escalation's model cannot be priced under a cost cap): the stream ends on an error event of its API, and the refused call never reaches the client (each API)"
# stubborn's third write is blocked, the re-ask escalated to a model the
# price table does not have while the run has a cost cap: model_not_priced
# (400), as a key's limit (402), a workspace's (403) or an in-flight cap
# (429) would refuse it. Earlier builds ended the stream on the first
# answer's finish: Responses' response.completed still listed the blocked
# call (the client ran it), Messages and Chat Completions ended on
# tool_use / tool_calls with no call.
echo '{"limits":{"max_cost_usd":100},"cascade":{"escalate":{"model":"unpriced-model","turns":2},"hide_turns":0}}' >"$TMP/policies/unpriced.json"
echo '{"models":{"stubborn":{"input_usd_per_mtok":1,"output_usd_per_mtok":1}},"default_max_tokens":1000}' >"$TMP/prices-stubborn.json"
start_server rr --store memory: --upstream "$FAKE/v1" --policies "$TMP/policies" --prices "$TMP/prices-stubborn.json" --log "$TMP/rr.log"
for api in chat messages responses; do
  out=$(guard API=$api BASE_URL="$([ $api = messages ] && echo "$rr_URL" || echo "$rr_URL/v1")" MODEL=stubborn STREAM=1 \
    HEADERS="{\"X-Loopguard-Policy\":\"unpriced\",\"X-Loopguard-Run\":\"reask-refused-$api\"}")
  [ "$(echo "$out" | get 'd["ended"]')" = error ] || fail "re-ask refused ($api): the stream did not end on an error: $out"
  echo "$out" | get 'd["error"]' | grep_q "cannot be priced" || fail "re-ask refused ($api): not the refusal's error: $out"
  [ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 2 ] || fail "re-ask refused ($api): the blocked call reached the client: $out"
  curl -sf "$rr_URL/v1/runs/reask-refused-$api/trace" >"$TMP/rr.jsonl" && "$LG_BIN" replay --json "$TMP/rr.jsonl" >"$TMP/rr.replay" ||
    fail "re-ask refused ($api): replay"
  [ "$(tail -n 1 "$TMP/rr.replay" | get 'd["blocked_calls"]')" = 1 ] || fail "re-ask refused ($api): not one call blocked: $(cat "$TMP/rr.replay")"
done
stop_server rr

note "the sidecar's decisions carry the cascade fields too"
pol='{"cascade":{"offer":["ask_human"],"escalate":{"model":"big","turns":2}}}'
curl -sf -X POST "$g_URL/v1/runs" -H 'content-type: application/json' -d "{\"run_id\":\"side-1\",\"policy\":$pol}" >/dev/null || fail "sidecar run"
for i in 1 2 3; do
  d=$(curl -sf -X POST "$g_URL/v1/runs/side-1/calls" -H 'content-type: application/json' -d '{"tool":"w","args":{"a":1}}') || fail "sidecar call"
done
[ "$(echo "$d" | get 'd["action"]')" = block ] || fail "sidecar: $d"
[ "$(echo "$d" | get 'd["escalate_model"], d["escalate_turns"], d["hide_tools"], d["alternatives"]')" = '["big", 2, ["w"], ["ask_human"]]' ] || fail "sidecar block: $d"
m=$(curl -sf -X POST "$g_URL/v1/runs/side-1/model" -H 'content-type: application/json' -d '{"input_tokens":10}') || fail "sidecar model"
[ "$(echo "$m" | get 'd["escalate_model"], d["offer"], d["hide_tools"]')" = '["big", ["ask_human"], ["w"]]' ] || fail "sidecar model: $m"

note "gateway.final_round: one more answer with tool use off replaces the stop's message"
for api in chat messages; do
  for stream in 0 1; do
    out=$(guard API=$api BASE_URL="$(base_of $api)" MODEL=yielding STREAM=$stream HEADERS='{"X-Loopguard-Policy":"final"}') || fail "final $api: $out"
    [ "$(echo "$out" | get 'd["final"]')" = "I give up: the storage is read-only, so record 7 cannot be written." ] || fail "final round $api $stream: $out"
  done
done
out=$(guard BASE_URL="$g_URL/v1" MODEL=yielding) || fail "no final round: $out"
echo "$out" | get 'd["final"]' | grep_q "I give up" && fail "final round without gateway.final_round: $out"

note "a coding agent's edit/test cycle: stopped by the default policy, run to the end with examples/policies/coding-agent.json"
# The same test command after each edit (docs/policy.md, "Coding agents"):
# by default its 3rd run is blocked and the tests never pass; with the
# recipe all five runs and four edits reach the client, nothing is blocked
# and the agent ends on the model's own answer.
for api in chat messages responses; do
  for st in 0 1; do
    if [ "$api$st" = chat0 ] || [ "$api$st" = messages1 ]; then # the default policy: one engine for every API
      out=$(guard API=$api BASE_URL="$(base_of $api)" STREAM=$st MODEL=edit-test CODING=1 STEP_CAP=20 \
        HEADERS="{\"X-Loopguard-Run\":\"edit-default-$api-$st\"}") || fail "edit/test default $api $st: $out"
      [ "$(echo "$out" | get 'd["ended"], d["executions"]["Bash"] <= 2')" = '["final", true]' ] ||
        fail "edit/test $api $st, default policy: not stopped before the tests pass: $out"
      [ "$(echo "$out" | get 'd["final"]')" = "Done: the tests pass." ] && fail "edit/test $api $st, default policy: the tests passed: $out"
    fi
    out=$(guard API=$api BASE_URL="$(base_of $api)" STREAM=$st MODEL=edit-test CODING=1 STEP_CAP=20 \
      HEADERS="{\"X-Loopguard-Policy\":\"coding-agent\",\"X-Loopguard-Run\":\"edit-coding-$api-$st\"}") || fail "edit/test coding-agent $api $st: $out"
    [ "$(echo "$out" | get 'd["ended"], d["final"], d["executions"]')" = '["final", "Done: the tests pass.", {"Bash": 5, "Edit": 4}]' ] ||
      fail "edit/test $api $st, coding-agent.json: $out"
    [ "$(echo "$out" | get '[s["action"] for s in d["seen"] if s["action"] not in ("execute", "pass")]')" = '[]' ] ||
      fail "edit/test $api $st, coding-agent.json: an intervention: $out"
    st_run=$(jq_url "$g_URL/v1/runs/edit-coding-$api-$st" 'd["status"]')
    [ "$st_run" = active ] || fail "edit/test $api $st, coding-agent.json: the run is $st_run"
  done
done

note "a body the guard does not change reaches the upstream byte for byte (each API); a changed one is rewritten"
# White space, key order, 0.7 and a \u escape: all of it would change in a
# parse-and-dump round trip.
printf '{ "model" : "finish",\n  "temperature": 0.7, "messages": [ {"content": "caf\\u00e9 \\/ x", "role": "user"} ],\n  "tools": [ {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}} ] }\n' >"$TMP/raw-chat.json"
printf '{ "max_tokens" : 100, "model": "finish", "messages": [ {"role": "user", "content": "caf\\u00e9"} ],\n  "tools": [ {"name": "lookup", "input_schema": {"type": "object"}} ], "temperature": 0.7 }' >"$TMP/raw-messages.json"
printf '{ "model": "finish",\n "input": [ {"role": "user", "content": "caf\\u00e9"} ], "tools": [ {"type": "function", "name": "lookup", "parameters": {"type": "object"}} ], "top_p": 0.9 }' >"$TMP/raw-responses.json"
printf '{ "model": "finish", "stream": true,\n  "messages": [ {"role": "user", "content": "caf\\u00e9"} ] }' >"$TMP/raw-stream.json"
sent_raw() { # API FILE RUN: the request, then the body the upstream got last
  curl -sf -o /dev/null -H 'content-type: application/json' -H "X-Loopguard-Run: $3" \
    --data-binary @"$2" "$g_URL/v1/$1" || fail "unchanged body ($1): the request failed"
  stats 'd["raw"][-1]'
}
for api in chat/completions messages responses; do
  f="$TMP/raw-${api%%/*}.json"
  [ "$(sent_raw "$api" "$f" "raw-${api%%/*}")" = "$(cat "$f")" ] ||
    fail "unchanged body ($api): the upstream got $(stats 'd["raw"][-1]'), not $(cat "$f")"
  # the model call's worst case covers the bytes sent, white space and all
  worst=$(curl -sf "$g_URL/v1/runs/raw-${api%%/*}/trace" | grep '"type":"model"' | get 'd["input_tokens"]')
  [ "$worst" -ge "$(wc -c <"$f")" ] || fail "unchanged body ($api): a worst case of $worst for $(wc -c <"$f") bytes"
done
# Chat Completions' n: n answers, each up to max_tokens, in the worst case
for n in 1 3; do
  curl -sf -o /dev/null -H 'content-type: application/json' -H "X-Loopguard-Run: choices-$n" \
    -d "{\"model\":\"finish\",\"n\":$n,\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}" \
    "$g_URL/v1/chat/completions" || fail "n=$n: the request failed"
  worst=$(curl -sf "$g_URL/v1/runs/choices-$n/trace" | grep '"type":"model"' | get 'd["max_tokens"]')
  [ "$worst" = $((100 * n)) ] || fail "n=$n, max_tokens 100: the worst case's max_tokens is $worst"
done
# A Responses request that continues a conversation the upstream stores
# (previous_response_id) is billed what that conversation holds again, as
# input: its worst case counts it (the answer's usage: input + output;
# until session 30 only the request's bytes)
curl -sf -o "$TMP/r1.json" -H 'content-type: application/json' -H "X-Loopguard-Run: stored" \
  -d '{"model":"finish","input":"hello"}' "$g_URL/v1/responses" || fail "stored: the first request failed"
held=$(get 'd["usage"]["input_tokens"] + d["usage"]["output_tokens"]' <"$TMP/r1.json")
# (it asked for a call: the continuation brings its output)
body2="{\"model\":\"finish\",\"previous_response_id\":\"$(get 'd["id"]' <"$TMP/r1.json")\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"$(get 'd["output"][0]["call_id"]' <"$TMP/r1.json")\",\"output\":\"{}\"}]}"
curl -sf -o /dev/null -H 'content-type: application/json' -H "X-Loopguard-Run: stored" -d "$body2" \
  "$g_URL/v1/responses" || fail "stored: the continuation failed"
worst=$(curl -sf "$g_URL/v1/runs/stored/trace" | grep '"type":"model"' | tail -n 1 | get 'd["input_tokens"]')
[ "$worst" = $((${#body2} + held)) ] ||
  fail "stored: the continuation's worst case counts $worst input tokens, not its ${#body2} bytes and the $held held"
# A stream without stream_options: the usage chunk (which settles the cost)
# asked for in front of the client's bytes, the rest as they came.
got=$(sent_raw chat/completions "$TMP/raw-stream.json" raw-stream)
raw=$(cat "$TMP/raw-stream.json")
[ "$got" = "{\"stream_options\":{\"include_usage\":true},${raw#\{}" ] ||
  fail "a stream without stream_options: the upstream got $got"
# With stream_options that do not ask for it: the body is rewritten.
printf '{ "model": "finish", "stream": true, "stream_options": {},\n  "messages": [ {"role": "user", "content": "caf\\u00e9"} ] }' >"$TMP/raw-stream2.json"
got=$(sent_raw chat/completions "$TMP/raw-stream2.json" raw-stream2)
[ "$got" != "$(cat "$TMP/raw-stream2.json")" ] || fail "a stream without include_usage reached the upstream unchanged"
[ "$(echo "$got" | get 'd["stream_options"]["include_usage"], d["messages"][0]["content"]')" = '[true, "caf\u00e9"]' ] ||
  fail "a stream without include_usage: the upstream got $got"

# result_in_trace RUN API FIRST IDEXPR SECOND WANT: run RUN's first turn
# on /v1/API (FIRST), the call id its answer asks for (IDEXPR, a get
# expression), then SECOND with @ID@ that id, the call and its result;
# the run's trace must hold a result with WANT.
result_in_trace() {
  local run=$1 api=$2 id
  id=$(curl -sf -H 'content-type: application/json' -H "X-Loopguard-Run: $run" -d "$3" "$g_URL/v1/$api" | get "$4") ||
    fail "$run: the first turn"
  curl -sf -o /dev/null -H 'content-type: application/json' -H "X-Loopguard-Run: $run" -d "${5//@ID@/$id}" "$g_URL/v1/$api" ||
    fail "$run: the second turn"
  curl -sf "$g_URL/v1/runs/$run/trace" | grep '"type":"result"' | grep_q -F "$6" ||
    fail "$run: no result with $6 in $(curl -sf "$g_URL/v1/runs/$run/trace")"
}

note "tool results as the structured result contract, a status spelled with an escape too; others as plain text"
turn1='{"model":"finish","messages":[{"role":"user","content":"look c-1 up"}],"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]}'
for k in 1 2 3; do
  case $k in
    1) content='{\"status\":\"fatal\",\"progress_version\":3,\"value\":{\"error\":\"gone\"}}' want='"status":"fatal","progress_version":3' ;;
    2) content='{\"st\\u0061tus\":\"permission_denied\",\"value\":\"no\"}' want='"status":"permission_denied"' ;;
    3) content='{\"state\":\"fatal\",\"statuses\":1}' want='"status":"progress","value":"{\"state\"' ;;
  esac
  result_in_trace structured-$k chat/completions "$turn1" 'd["choices"][0]["message"]["tool_calls"][0]["id"]' \
    "{\"model\":\"finish\",\"messages\":[{\"role\":\"user\",\"content\":\"look c-1 up\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"@ID@\",\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"@ID@\",\"content\":\"$content\"}]}" \
    "$want"
done

note "tool results on the other APIs: an Anthropic tool_result block's is_error (retryable), a Responses function_call_output's status"
# Read when the step decides them (its fill): a block of the user
# message, an input item.
result_in_trace late-messages messages \
  '{"model":"finish","max_tokens":64,"messages":[{"role":"user","content":"look c-1 up"}],"tools":[{"name":"lookup","input_schema":{"type":"object"}}]}' \
  '[b["id"] for b in d["content"] if b["type"] == "tool_use"][0]' \
  '{"model":"finish","max_tokens":64,"tools":[{"name":"lookup","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"look c-1 up"},{"role":"assistant","content":[{"type":"tool_use","id":"@ID@","name":"lookup","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"@ID@","is_error":true,"content":"Error: the directory is down."}]}]}' \
  '"status":"retryable","value":"Error: the directory is down."'
result_in_trace late-responses responses \
  '{"model":"finish","input":[{"role":"user","content":"look c-1 up"}],"tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}]}' \
  '[o["call_id"] for o in d["output"] if o["type"] == "function_call"][0]' \
  '{"model":"finish","tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}],"input":[{"role":"user","content":"look c-1 up"},{"type":"function_call","call_id":"@ID@","name":"lookup","arguments":"{}"},{"type":"function_call_output","call_id":"@ID@","output":"{\"status\":\"fatal\",\"value\":\"gone\"}"}]}' \
  '"status":"fatal"'

note "an Anthropic user message of tool results and a text after them (Claude Code's reminders): the results read, no new episode"
# The trace holds the result and no user event: the text is the client's
# beside its results, not the person's (earlier builds took the message
# for the person's alone, and its results were never read).
result_in_trace late-messages-text messages \
  '{"model":"finish","max_tokens":64,"messages":[{"role":"user","content":"look c-1 up"}],"tools":[{"name":"lookup","input_schema":{"type":"object"}}]}' \
  '[b["id"] for b in d["content"] if b["type"] == "tool_use"][0]' \
  '{"model":"finish","max_tokens":64,"tools":[{"name":"lookup","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"look c-1 up"},{"role":"assistant","content":[{"type":"tool_use","id":"@ID@","name":"lookup","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"@ID@","content":"Customer 1, gold"},{"type":"text","text":"<system-reminder>Be brief.</system-reminder>"}]}]}' \
  '"status":"progress","value":"Customer 1, gold"'
order=$(curl -sf "$g_URL/v1/runs/late-messages-text/trace" |
  python3 -c 'import json, sys; print(" ".join(json.loads(l)["type"] for l in sys.stdin if l.strip() and not l.startswith("#")))')
[[ " $order " == *" call result model "* && " $order " != *" user "* ]] ||
  fail "results and a text: the trace is $order, not call, result, model (no user event)"

note "Responses: continuing from an answer the gateway made itself never sends its id upstream (stream false and true)"
for st in false true; do
  curl -sf -o "$TMP/own1.txt" -H 'content-type: application/json' -H 'X-Loopguard-Policy: chant' \
    -d "{\"model\":\"chant\",\"stream\":$st,\"input\":[{\"role\":\"user\",\"content\":\"any news?\"}]}" "$g_URL/v1/responses" ||
    fail "own id ($st): the first request"
  if [ $st = true ]; then # the id of the stream's response.completed
    own=$(python3 -c 'import json,sys; print([json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")][-1]["response"]["id"])' "$TMP/own1.txt")
  else own=$(get 'd["id"]' <"$TMP/own1.txt"); fi
  case $own in resp_lg*) ;; *) fail "own id ($st): the stop's answer has id '$own': $(head -c 600 "$TMP/own1.txt")" ;; esac
  code=$(curl -s -o "$TMP/own2.txt" -w '%{http_code}' -H 'content-type: application/json' \
    -d "{\"model\":\"finish\",\"previous_response_id\":\"$own\",\"input\":[{\"role\":\"user\",\"content\":\"something else, then\"}]}" "$g_URL/v1/responses")
  [ "$code" = 200 ] || fail "own id ($st): continuing from $own answered $code: $(cat "$TMP/own2.txt")"
  up=$(stats 'd["raw"][-1]')
  echo "$up" | grep >/dev/null "$own" && fail "own id ($st): the upstream got the gateway's own id: $up"
  [ "$(echo "$up" | get '[i.get("role") for i in d["input"]], "previous_response_id" in d')" = '[["user", "assistant", "user"], false]' ] ||
    fail "own id ($st): the upstream did not get the conversation again: $up"
  echo "$up" | get 'd["input"][1]["content"][0]["text"]' | grep_q "repeating" || fail "own id ($st): not the stop's answer: $up"
done

# refused_header HEADER CODE: a request with HEADER ("Name: value") is 400
# on Chat Completions (its error code CODE, the message naming the header)
# and on /v1/messages (Anthropic's shape), and nothing is sent upstream
refused_header() {
  local c0 name=${1%%:*}
  c0=$(stats 'd["requests"]')
  code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -H "$1" \
    -d '{"model":"finish","messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/chat/completions")
  [ "$code" = 400 ] && [ "$(get 'd["error"]["code"]' <"$TMP/e.json")" = "$2" ] || fail "$1: $code $(cat "$TMP/e.json")"
  get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "$name" || fail "$1: the message does not name $name: $(cat "$TMP/e.json")"
  code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' -H "$1" \
    -d '{"model":"finish","max_tokens":10,"messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/messages")
  [ "$code" = 400 ] && [ "$(get 'd["type"], d["error"]["type"]' <"$TMP/e.json")" = '["error", "invalid_request_error"]' ] ||
    fail "$1 (messages): $code $(cat "$TMP/e.json")"
  # (each GET /stats counts itself: one more than c0, nothing else)
  [ "$(stats 'd["requests"]')" = "$((c0 + 1))" ] || fail "$1: sent upstream ($c0 -> $(stats 'd["requests"]') requests)"
}

note "X-Loopguard-Policy naming no policy: 400 in the API's shape, naming the header, nothing sent upstream"
refused_header 'X-Loopguard-Policy: nope' unknown_policy
mkdir -p "$TMP/badpol" && echo '{"repeat":{"block":"three"}}' >"$TMP/badpol/strict.json"
if "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$FAKE/v1" --policies "$TMP/badpol" >"$TMP/badpol.out" 2>&1; then
  fail "a bad policy in --policies started"
fi
grep -q "strict.json" "$TMP/badpol.out" && grep -q "repeat.block" "$TMP/badpol.out" || fail "bad --policies: $(cat "$TMP/badpol.out")"

note "X-Loopguard-Run that is no run id (a '/' in it): 400 invalid_run in the API's shape, naming the header, nothing sent upstream"
refused_header 'X-Loopguard-Run: team/run-1' invalid_run
note "X-Loopguard-Group with a '/' (POST /v1/groups/{group}/cancel could not name it): 400 invalid_group"
refused_header 'X-Loopguard-Group: team/a' invalid_group
refused_header 'X-Loopguard-Run: ..' invalid_run
# a byte that is not UTF-8 (a header may carry one): no JSON could hold
# the run's id (GET /v1/runs answered text no JSON reader took)
refused_header $'X-Loopguard-Run: ab\xffcd' invalid_run

note "a background response (polled for, so never decided nor counted): 400 naming background, nothing sent upstream"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'content-type: application/json' \
  -d '{"model":"loop-write","background":true,"input":"Write record 7."}' "$g_URL/v1/responses")
[ "$code" = 400 ] && [ "$(get 'd["error"]["code"]' <"$TMP/e.json")" = unsupported_value ] || fail "background: $code $(cat "$TMP/e.json")"
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "^background: " || fail "background: the message: $(cat "$TMP/e.json")"
[ "$(stats 'int(any("background" in b for b in d["raw"]))')" = 0 ] || fail "background: the request went upstream"

note "errors in each API's shape: a body over the limit (413, --gateway-max-body: 64 MiB)"
# a sparse file: curl asks with Expect: 100-continue and the 413 comes before the body
truncate -s $((64 * 1024 * 1024 + 1)) "$TMP/big.txt"
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' --data-binary @"$TMP/big.txt" "$g_URL/v1/chat/completions")
[ "$code" = 413 ] && [ "$(get 'd["error"]["type"], d["error"]["code"], "param" in d["error"]' <"$TMP/e.json")" = '["invalid_request_error", "payload_too_large", true]' ] &&
  grep -q -- '--gateway-max-body' "$TMP/e.json" ||
  fail "413 chat: $code $(cat "$TMP/e.json")"
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' --data-binary @"$TMP/big.txt" "$g_URL/v1/messages")
[ "$code" = 413 ] && [ "$(get 'd["type"], d["error"]["type"]' <"$TMP/e.json")" = '["error", "request_too_large"]' ] || fail "413 messages: $code $(cat "$TMP/e.json")"

note "a malformed body: 400 in each API's shape"
# the members the guard reads as the provider will: a stream that is not a
# boolean (read as false, a lenient server's stream was a 502 after the
# call was paid), max tokens and n that are not whole numbers
for m in '"stream":1' '"stream":"yes"' '"max_tokens":1e3' '"max_tokens":-5' '"n":0' '"max_completion_tokens":"9"'; do
  for api in chat messages; do
    path=chat/completions; [ $api = messages ] && path=messages
    before=$(stats 'd["requests"]')
    code=$(curl -s -H "Content-Type: application/json" -H 'anthropic-version: 2023-06-01' -o "$TMP/e.json" -w '%{http_code}' \
      -d "{\"model\":\"finish\",$m,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}" "$g_URL/v1/$path")
    [ "$code" = 400 ] && get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "^$(echo "$m" | cut -d'"' -f2): expected" ||
      fail "$m on $api: $code $(cat "$TMP/e.json")"
    [ "$(stats 'd["requests"]')" = $((before + 1)) ] || fail "$m on $api: sent upstream" # (+ the look at stats)
  done
done
for m in '"stream":null' '"max_tokens":null' '"n":null'; do
  code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' \
    -d "{\"model\":\"finish\",$m,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}" "$g_URL/v1/chat/completions")
  [ "$code" = 200 ] || fail "$m (as absent): $code $(cat "$TMP/e.json")"
done
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' -d '{"model":' "$g_URL/v1/responses")
[ "$code" = 400 ] && [ "$(get 'd["error"]["type"], d["error"]["code"]' <"$TMP/e.json")" = '["invalid_request_error", "invalid_json"]' ] || fail "malformed responses: $code $(cat "$TMP/e.json")"
# JSON that is not an object (an array; a scalar is refused by the reader
# itself, at its line and column): what it is, on each API, and nothing
# sent upstream (the message named a line and column until session 53: a
# parse that succeeded leaves them unset, so they were another request's)
for body in '[1,2]' '"x"'; do
  for path in chat/completions messages responses; do
    before=$(stats 'd["requests"]')
    code=$(curl -s -H "Content-Type: application/json" -H 'anthropic-version: 2023-06-01' -o "$TMP/e.json" -w '%{http_code}' \
      -d "$body" "$g_URL/v1/$path")
    want="the body is not a JSON object: it is an array"
    [ "$body" = '"x"' ] && want="the body is not a JSON object (line 1, column 3: '[' or '{' expected near '\"x\"')"
    [ "$code" = 400 ] && [ "$(get 'd["error"]["message"]' <"$TMP/e.json")" = "$want" ] ||
      fail "$body on $path: $code $(cat "$TMP/e.json")"
    [ "$(stats 'd["requests"]')" = $((before + 1)) ] || fail "$body on $path: sent upstream" # (+ the look at stats)
  done
done
# jansson's error quotes the bytes it stopped at, a byte at a time: after
# a backslash, the first byte of "é" alone, not UTF-8; it is U+FFFD in the
# 400, whose body stays strict JSON (before session 38 the byte was copied
# into it: fuzz_gateway found it)
printf '{"model":"finish","max_tokens":5,"messages":[{"role":"user","content":"\\\xc3\xa9"}],"input":"x"}' >"$TMP/bad-utf8.json"
for path in chat/completions messages responses; do
  code=$(curl -s -H "Content-Type: application/json" -H 'anthropic-version: 2023-06-01' -o "$TMP/e.json" -w '%{http_code}' \
    --data-binary @"$TMP/bad-utf8.json" "$g_URL/v1/$path")
  msg=$(python3 -c 'import json, sys; d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8")); print(d["error"]["message"])' "$TMP/e.json" 2>&1)
  [ "$code" = 400 ] && echo "$msg" | grep >/dev/null $'\xef\xbf\xbd' || fail "an error quoting half of a UTF-8 character on $path: $code $msg $(od -c "$TMP/e.json" | head -5)"
done

note "a stream of garbage from the upstream: 502, nothing half-written"
for api in chat messages; do
  path=$([ $api = chat ] && echo chat/completions || echo messages)
  code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' \
    -d '{"model":"garbage-stream","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/$path")
  [ "$code" = 502 ] || fail "garbage stream $api: $code $(cat "$TMP/e.json")"
  if [ $api = chat ]; then get 'd["error"]["code"]' <"$TMP/e.json" | grep_q upstream_bad_response || fail "garbage stream: $(cat "$TMP/e.json")"
  else [ "$(get 'd["type"], d["error"]["type"]' <"$TMP/e.json")" = '["error", "api_error"]' ] || fail "garbage stream messages: $(cat "$TMP/e.json")"; fi
done

note "a stream whose events end with any of SSE's three line ends (LF, CRLF, CR), mixed: read whole"
code=$(curl -s -N -H "Content-Type: application/json" -o "$TMP/ends.sse" -w '%{http_code}' \
  -d '{"model":"line-ends","stream":true,"messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/chat/completions")
text=$(python3 -c '
import json, re, sys
lines = re.split(r"\r\n|\r|\n", open(sys.argv[1], newline="").read())
data = [l[6:] for l in lines if l.startswith("data: ")]
assert lines[-1] == "" and lines[-2] == "", lines[-3:]  # the last event whole
assert data[-1] == "[DONE]", data
print("".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1] if json.loads(d)["choices"]))
' "$TMP/ends.sse" 2>&1)
[ "$code" = 200 ] && [ "$text" = "Hi there." ] || fail "line ends: $code $text $(od -c "$TMP/ends.sse" | head -20)"

note "odd answers of the upstream: read as the client reads them, the server keeps serving"
code=$(curl -s --max-time 10 -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' \
  -d '{"model":"odd-answer","input":"x"}' "$g_URL/v1/responses")
[ "$code" = 200 ] && [ "$(get 'd["id"]' <"$TMP/e.json")" = resp_odd ] || fail "odd responses answer: $code $(cat "$TMP/e.json")"
code=$(curl -s --max-time 10 -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' \
  -d '{"model":"odd-answer","messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/chat/completions")
[ "$code" = 502 ] && [ "$(get 'd["error"]["code"]' <"$TMP/e.json")" = upstream_bad_response ] || fail "a JSON array for an answer: $code $(cat "$TMP/e.json")"
curl -s -N --max-time 10 -H "Content-Type: application/json" \
  -d '{"model":"odd-answer","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"lookup"}}]}' \
  "$g_URL/v1/chat/completions" >"$TMP/odd.sse" || fail "odd stream: curl $?"
python3 - "$TMP/odd.sse" <<'PY' || fail "odd stream: $(cat "$TMP/odd.sse")"
import json, sys
text, events = "", 0
for block in open(sys.argv[1]).read().split("\n\n"):
    data = "\n".join(l[6:] if l.startswith("data: ") else l[5:] for l in block.split("\n") if l.startswith("data:"))
    if not block.strip() or data == "[DONE]":
        continue
    ev = json.loads(data)  # every event the client gets is JSON, read as SSE joins its lines
    events += 1
    for ch in ev.get("choices", []):
        assert not ch["delta"].get("tool_calls"), "a call at index 2^53 was passed on"
        text += ch["delta"].get("content") or ""
assert text == "Hi there.", text
PY
curl -sf "$g_URL/healthz" >/dev/null || fail "the server stopped serving after the odd answers"

note "a tool call's arguments of 120 KB streamed in 18,000 deltas: held, decided and passed on whole"
# (a file a coding agent writes: each delta appended to what came, not the
# whole copied again a delta, which took 44 s for 300 KB on /v1/messages)
for api in chat messages; do
  if [ $api = chat ]; then
    body='{"model":"big-write","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"write_file"}}]}'
  else
    body='{"model":"big-write","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"write_file","input_schema":{"type":"object"}}]}'
  fi
  curl -s -N --max-time 60 -H "Content-Type: application/json" -H "X-Loopguard-Run: big-$api" -d "$body" \
    "$g_URL/v1/$([ $api = chat ] && echo chat/completions || echo messages)" >"$TMP/big.sse" || fail "big $api: curl $?"
  python3 - "$TMP/big.sse" $api <<'PY' || fail "big $api: $(head -c 600 "$TMP/big.sse")"
import json, sys
args = ""
for block in open(sys.argv[1], encoding="utf-8").read().split("\n\n"):
    data = "\n".join(l[6:] for l in block.split("\n") if l.startswith("data: "))
    if not data or data == "[DONE]":
        continue
    ev = json.loads(data)
    if sys.argv[2] == "chat":
        for ch in ev.get("choices", []):
            for tc in ch["delta"].get("tool_calls") or []:
                assert tc["function"]["name"] == "write_file", tc
                args += tc["function"]["arguments"]
    elif ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "input_json_delta":
        args += ev["delta"]["partial_json"]
content = "".join("line %d: caf\u00e9 \"q\" \\ \u65e5\u672c\n" % i for i in range(4000))
assert json.loads(args) == {"path": "notes.txt", "content": content}, args[:300]
PY
done
[ "$(curl -s "$g_URL/v1/runs/big-chat/trace" | grep -c '"type":"call"')" = 1 ] || fail "big chat: the call is not in the run's trace"

note "an answer cut off by max_tokens in the middle of a call's arguments, streamed: the call passes as it came (undecidable), and the stream says max_tokens (Messages) / length (Chat Completions), not a whole call's tool_use"
# As the answer not streamed says: the upstream's stop_reason kept (earlier
# builds ended every stream with calls on tool_use / tool_calls, a cut-off
# call presented as complete).
for api in messages chat responses; do
  if [ $api = chat ]; then
    path=chat/completions body='{"model":"truncated","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"write_record"}}]}'
  elif [ $api = responses ]; then
    path=responses body='{"model":"truncated","stream":true,"input":"x","tools":[{"type":"function","name":"write_record","parameters":{"type":"object"}}]}'
  else
    path=messages body='{"model":"truncated","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"write_record","input_schema":{"type":"object"}}]}'
  fi
  for st in true false; do
    curl -s -N --max-time 20 -H "Content-Type: application/json" -H "X-Loopguard-Run: truncated-$api-$st" \
      -d "${body/\"stream\":true/\"stream\":$st}" "$g_URL/v1/$path" >"$TMP/trunc.out" || fail "truncated $api $st: curl $?"
    python3 - "$TMP/trunc.out" $api $st <<'PY' || fail "truncated $api stream $st: $(head -c 1500 "$TMP/trunc.out")"
import json, sys
text, api, st = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3] == "true"
if api == "responses": # the upstream's incomplete kept: status, and a stream's last event
    evs = [json.loads("\n".join(l[6:] for l in b.split("\n") if l.startswith("data: ")))
           for b in text.split("\n\n") if "data: " in b] if st else []
    d = evs[-1]["response"] if st else json.loads(text)
    assert d["status"] == "incomplete", d
    assert not st or evs[-1]["type"] == "response.incomplete", evs[-1]["type"]
    calls = [i for i in d["output"] if i["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["arguments"] == '{"record_id":7,"val', calls
    sys.exit(0)
if not st:
    d = json.loads(text)
    fin = d["stop_reason"] if api == "messages" else d["choices"][0]["finish_reason"]
    calls = [b for b in d["content"] if b["type"] == "tool_use"] if api == "messages" else d["choices"][0]["message"]["tool_calls"]
    assert fin == ("max_tokens" if api == "messages" else "length") and len(calls) == 1, (fin, calls)
    sys.exit(0)
args, fin = "", None
for block in text.split("\n\n"):
    data = "\n".join(l[6:] for l in block.split("\n") if l.startswith("data: "))
    if not data or data == "[DONE]":
        continue
    ev = json.loads(data)
    if api == "chat":
        for ch in ev.get("choices", []):
            for tc in ch["delta"].get("tool_calls") or []:
                args += tc["function"].get("arguments") or ""
            fin = ch.get("finish_reason") or fin
    elif ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "input_json_delta":
        args += ev["delta"]["partial_json"]
    elif ev.get("type") == "message_delta":
        fin = ev["delta"]["stop_reason"]
assert args == '{"record_id":7,"val', args
assert fin == ("max_tokens" if api == "messages" else "length"), fin
PY
  done
done

note "an upstream stream cut off mid-way: the client's stream ends on an error event of its API"
curl -s -N -H "Content-Type: application/json" -d '{"model":"cutoff","stream":true,"messages":[{"role":"user","content":"x"}]}' \
  "$g_URL/v1/chat/completions" >"$TMP/cut.sse"
grep -q '"content":"Partial "' "$TMP/cut.sse" || fail "cutoff: the text was not forwarded: $(cat "$TMP/cut.sse")"
tail -n 2 "$TMP/cut.sse" | head -n 1 | sed 's/^data: //' | get 'd["error"]["type"]' | grep_q upstream_error || fail "cutoff chat: $(cat "$TMP/cut.sse")"
curl -s -N -H "Content-Type: application/json" -d '{"model":"cutoff","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"x"}]}' \
  "$g_URL/v1/messages" >"$TMP/cut.sse"
tail -n 3 "$TMP/cut.sse" | grep_q '^event: error' || fail "cutoff messages: $(cat "$TMP/cut.sse")"
out=$(guard BASE_URL="$g_URL/v1" MODEL=cutoff STREAM=1)
[ "$(echo "$out" | get 'd["ended"]')" = error ] || fail "cutoff: the SDK took a cut stream for an answer: $out"
n=$(curl -sf "$g_URL/metrics" | awk '$1 == "loopguard_gateway_upstream_errors_total{upstream=\"default\",kind=\"broken\"}" { print $2 }')
[ "${n:-0}" -ge 3 ] || fail "cutoff: the broken answers not counted (${n:-none})"

note "the provider's own error event mid-stream (Anthropic's overloaded_error, OpenAI's server_error): the SDK reports it, as directly"
for api in chat messages responses; do
  out=$(guard API=$api BASE_URL="$(base_of $api)" MODEL=overload STREAM=1)
  direct=$(guard API=$api BASE_URL="$([ $api = messages ] && echo "$FAKE" || echo "$FAKE/v1")" MODEL=overload STREAM=1)
  [ "$(echo "$out" | get 'd["ended"]')" = error ] && [ "$(echo "$out" | get 'd["error"]')" = "$(echo "$direct" | get 'd["error"]')" ] ||
    fail "overload $api: through the gateway $out, directly $direct"
  echo "$out" | get 'd["error"]' | grep_q 'overloaded_error\|server had an error' || fail "overload $api: $out"
done

note "an upstream's SSE comments (OpenRouter's keep-alive while queued): on to the client as they come"
t=$(curl -s -N -o "$TMP/queued.sse" -w '%{time_starttransfer} %{time_total}' -H "Content-Type: application/json" \
  -d '{"model":"queued","stream":true,"messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/chat/completions")
[ "$(head -n 1 "$TMP/queued.sse")" = ": OPENROUTER PROCESSING" ] && [ "$(grep -c '^: OPENROUTER PROCESSING$' "$TMP/queued.sse")" = 3 ] ||
  fail "queued: the comments were not passed on: $(cat "$TMP/queued.sse")"
# the first bytes came with the first comment, not with the answer 0.9 s later
python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if a < 0.5 and b >= 0.85 else 1)" $t ||
  fail "queued: the first byte at ${t% *} s of ${t#* } (held until the answer)"
out=$(guard API=chat BASE_URL="$g_URL/v1" MODEL=queued STREAM=1)
[ "$(echo "$out" | get 'd["final"]')" = Done. ] || fail "queued: the SDK's answer: $out"

note "a call whose arguments come for 2 s, held until decided: SSE comments keep the client's connection alive"
LOOPGUARD_GATEWAY_KEEPALIVE_MS=400 start_server ka --store memory: --upstream "$FAKE/v1" --log "$TMP/ka.log"
python3 - "$ka_URL" <<'PY' || fail "slow-call: the held stream's keep-alive"
import http.client, json, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
c.request("POST", "/v1/chat/completions", json.dumps({"model": "slow-call", "stream": True,
          "messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]}),
          {"Content-Type": "application/json"})
r = c.getresponse()
t0, gaps, last, comments, args = time.time(), [], time.time(), 0, ""
while True:
    line = r.readline()
    if not line:
        break
    now = time.time()
    line = line.decode().rstrip("\n")
    if not line:
        continue
    gaps.append(now - last)
    last = now
    if line.startswith(":"):
        comments += 1
    elif line.startswith("data: {"):
        for ch in json.loads(line[6:]).get("choices", []):
            for tc in ch["delta"].get("tool_calls") or []:
                args += tc["function"].get("arguments") or ""
assert comments >= 2, (comments, gaps)
assert max(gaps) < 1.0, ("a silence of %.2f s while the call was held" % max(gaps), gaps)
assert json.loads(args) == {"record_id": 7, "value": "slowly"}, args
PY
out=$(guard API=chat BASE_URL="$ka_URL/v1" MODEL=slow-call STREAM=1)
[ "$(echo "$out" | get 'd["final"]')" = Done. ] && [ "$(echo "$out" | get 'd["executions"]["write_record"]')" = 1 ] ||
  fail "slow-call: the SDK, with the keep-alive comments: $out"
stop_server ka
LOOPGUARD_GATEWAY_KEEPALIVE_MS=soon "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$FAKE/v1" \
  --policies "$TMP/policies" >"$TMP/ka.out" 2>&1 && fail "LOOPGUARD_GATEWAY_KEEPALIVE_MS=soon started"
grep -q "LOOPGUARD_GATEWAY_KEEPALIVE_MS" "$TMP/ka.out" || fail "a bad keep-alive: $(cat "$TMP/ka.out")"
# (under ASan: the named policies loaded before the bad variable are freed)
grep -q "LeakSanitizer" "$TMP/ka.out" && fail "a start that failed leaked: $(cat "$TMP/ka.out")"

note "a client that hangs up mid-stream: the upstream request is aborted, the server keeps serving"
before=$(stats 'd["aborted"]')
curl -s -H "Content-Type: application/json" -N --max-time 0.6 -d '{"model":"drip-long","stream":true,"messages":[{"role":"user","content":"x"}]}' \
  "$g_URL/v1/chat/completions" >/dev/null 2>&1
for i in $(seq 50); do [ "$(stats 'd["aborted"]')" -gt "$before" ] && break; sleep 0.1; done
[ "$(stats 'd["aborted"]')" -gt "$before" ] || fail "hang-up: the upstream request went on"
curl -sf "$g_URL/healthz" >/dev/null || fail "the server stopped serving after a hang-up"

note "an upstream that is down: 502 in the Anthropic shape on /v1/messages, naming it"
start_server down --store memory: --upstream "http://127.0.0.1:9/v1"
code=$(curl -s -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' -d '{"model":"x","max_tokens":5,"messages":[{"role":"user","content":"x"}]}' "$down_URL/v1/messages")
[ "$code" = 502 ] && [ "$(get 'd["type"]' <"$TMP/e.json")" = error ] && grep -q "127.0.0.1:9" "$TMP/e.json" || fail "down: $code $(cat "$TMP/e.json")"
stop_server down

note "with tokens, a gateway request needs a loopguard key: 401 in each API's shape otherwise"
printf 'agent gw-agent-token-0123456789\noperator gw-operator-token-0123456789\n' >"$TMP/tokens"
echo '{"upstreams":{"fake":{"base_url":"'"$FAKE"'/v1","api_key_env":"FAKE_KEY"}}}' >"$TMP/ups.json"
echo '{"models":{"finish":{"input_usd_per_mtok":1,"output_usd_per_mtok":1}}}' >"$TMP/prices.json" # a key's spend is priced
FAKE_KEY=sk-upstream start_server auth --store memory: --upstreams "$TMP/ups.json" --tokens "$TMP/tokens" --prices "$TMP/prices.json"
# gw_call PATH AUTH-HEADER: a request to the gateway; the status, the body in $TMP/e.json
gw_call() {
  local body='{"model":"finish","max_tokens":5,"messages":[{"role":"user","content":"x"}]}'
  [ "$1" = /v1/responses ] && body='{"model":"finish","max_output_tokens":5,"input":"x"}'
  curl -s -H "Content-Type: application/json" -H 'anthropic-version: 2023-06-01' ${2:+-H "$2"} \
    -o "$TMP/e.json" -w '%{http_code}' -d "$body" "$auth_URL$1"
}
needs_key() { # what the message of a 401 without a key says
  get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "needs a loopguard key: send Authorization: Bearer lgk-"
}
for cred in "" "Authorization: Bearer gw-agent-token-0123456789" "Authorization: Bearer gw-operator-token-0123456789" "Authorization: Bearer wrong-token-0123456789"; do
  for path in /v1/chat/completions /v1/responses; do
    code=$(gw_call $path "$cred")
    [ "$code" = 401 ] && [ "$(get '[d["error"]["type"], d["error"]["code"]]' <"$TMP/e.json")" = '["invalid_request_error", "invalid_api_key"]' ] &&
      needs_key || fail "401 $path with '${cred:-nothing}': $code $(cat "$TMP/e.json")"
  done
  code=$(gw_call /v1/messages "${cred/Authorization: Bearer/x-api-key:}")
  [ "$code" = 401 ] && [ "$(get '[d["type"], d["error"]["type"]]' <"$TMP/e.json")" = '["error", "authentication_error"]' ] &&
    needs_key || fail "401 messages with '${cred:-nothing}': $code $(cat "$TMP/e.json")"
done
gw_call /v1/chat/completions "Authorization: Bearer gw-agent-token-0123456789" >/dev/null
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "not a loopguard token" || fail "a token on the gateway: the message does not say it is not a key: $(cat "$TMP/e.json")"
# The operator API still takes the operator token; a key made there works.
key=$(curl -s -X POST -H 'Authorization: Bearer gw-operator-token-0123456789' -H 'Content-Type: application/json' \
  -d '{"name":"guard"}' "$auth_URL/v1/keys" | get 'd["key"]') || fail "creating a key"
for path in /v1/chat/completions /v1/responses; do
  code=$(gw_call $path "Authorization: Bearer $key")
  [ "$code" = 200 ] || fail "a loopguard key on $path: $code $(cat "$TMP/e.json")"
done
code=$(gw_call /v1/messages "x-api-key: $key")
[ "$code" = 200 ] || fail "a loopguard key on /v1/messages: $code $(cat "$TMP/e.json")"
stop_server auth

note "credentials sent upstream: the upstream's own key alone (not beside a client's placeholder x-api-key), and a client's long Authorization whole"
echo '{"upstreams":{"claude":{"base_url":"'"$FAKE"'/v1","api":"anthropic","api_key_env":"FAKE_KEY"}}}' >"$TMP/ups-anth.json"
FAKE_KEY=sk-upstream-anth start_server anth --store memory: --upstreams "$TMP/ups-anth.json"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'Content-Type: application/json' -H 'anthropic-version: 2023-06-01' \
  -H 'x-api-key: sk-ant-placeholder' -d '{"model":"finish","max_tokens":5,"messages":[{"role":"user","content":"x"}]}' \
  "$anth_URL/v1/messages")
[ "$code" = 200 ] || fail "messages with the upstream's own key: $code $(cat "$TMP/e.json")"
[ "$(stats 'd["auths"][-1]')" = sk-upstream-anth ] || fail "the Anthropic upstream got x-api-key: $(stats 'd["auths"][-1]')"
stop_server anth
long="Bearer sk-$(head -c 2400 /dev/zero | tr '\0' 'x')" # an Entra ID token is 1.5 to 2.5 KB
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'Content-Type: application/json' -H "Authorization: $long" \
  -d '{"model":"finish","messages":[{"role":"user","content":"x"}]}' "$g_URL/v1/chat/completions")
[ "$code" = 200 ] || fail "a long Authorization: $code $(cat "$TMP/e.json")"
[ "$(stats 'd["auths"][-1]')" = "$long" ] || fail "a long Authorization reached the upstream cut: $(stats 'len(d["auths"][-1])') of ${#long} bytes"

note "an upstream answer past LOOPGUARD_GATEWAY_ANSWER_BYTES: dropped, a 502 in the API's shape, the server keeps serving"
out=$(LOOPGUARD_GATEWAY_ANSWER_BYTES=1k "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$FAKE/v1" 2>&1) &&
  fail "LOOPGUARD_GATEWAY_ANSWER_BYTES=1k was taken: $out"
echo "$out" | grep >/dev/null 'LOOPGUARD_GATEWAY_ANSWER_BYTES.*"1k"' || fail "LOOPGUARD_GATEWAY_ANSWER_BYTES=1k: $out"
LOOPGUARD_GATEWAY_ANSWER_BYTES=1048576 start_server flood --store memory: --upstream "$FAKE/v1"
code=$(curl -s --max-time 20 -H "Content-Type: application/json" -o "$TMP/e.json" -w '%{http_code}' \
  -d '{"model":"flood","messages":[{"role":"user","content":"x"}]}' "$flood_URL/v1/chat/completions")
[ "$code" = 502 ] && [ "$(get 'd["error"]["code"]' <"$TMP/e.json")" = upstream_bad_response ] &&
  get 'd["error"]["message"]' <"$TMP/e.json" | grep_q 'an answer over 1048576 bytes' ||
  fail "flood: $code $(head -c 300 "$TMP/e.json")"
# streamed: the text came first, so the client's stream ends on an error event
curl -s -N --max-time 20 -H "Content-Type: application/json" \
  -d '{"model":"flood","stream":true,"messages":[{"role":"user","content":"x"}]}' "$flood_URL/v1/chat/completions" >"$TMP/flood.sse"
grep -q '"content":"Hi"' "$TMP/flood.sse" && tail -n 2 "$TMP/flood.sse" | head -n 1 | sed 's/^data: //' |
  get 'd["error"]["message"]' | grep_q 'an event over 1048576 bytes' || fail "flood stream: $(head -c 600 "$TMP/flood.sse")"
# valid events without end: the text and the calls the stream keeps to decide at its end are bound too
for m in flood-text flood-args; do
  curl -s -N --max-time 20 -H "Content-Type: application/json" \
    -d '{"model":"'$m'","stream":true,"messages":[{"role":"user","content":"x"}]}' "$flood_URL/v1/chat/completions" >"$TMP/flood.sse"
  tail -n 2 "$TMP/flood.sse" | head -n 1 | sed 's/^data: //' | get 'd["error"]["message"]' |
    grep -q 'text and tool calls over 1048576 bytes' || fail "$m: $(tail -c 600 "$TMP/flood.sse")"
done
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Content-Type: application/json" \
  -d '{"model":"finish","messages":[{"role":"user","content":"x"}]}' "$flood_URL/v1/chat/completions")
[ "$code" = 200 ] || fail "after the floods, a request answered $code"
stop_server flood

note "runs past LOOPGUARD_GATEWAY_MAX_RUNS are evicted: an evicted conversation goes on as a new run"
LOOPGUARD_GATEWAY_MAX_RUNS=2 start_server lru --store memory: --upstream "$FAKE/v1"
e=$(client conversation.mjs MODE=evict OTHERS=3 BASE_URL="$lru_URL/v1") || fail "evict: $e"
[ "$(echo "$e" | get 'd["a1"]["calls"]')" = 1 ] || fail "evict: $e"
echo "$e" | get 'd["a2"]["text"]' | grep_q '^Done: {"customer_id":"c-1"' || fail "evict: the conversation did not go on: $e"
[ "$(echo "$e" | get 'd["a1"]["run"] != d["a2"]["run"]')" = true ] || fail "evict: A was not evicted (same run): $e"
e=$(client conversation.mjs MODE=evict OTHERS=1 BASE_URL="$lru_URL/v1") || fail "evict: $e"
[ "$(echo "$e" | get 'd["a1"]["run"] == d["a2"]["run"]')" = true ] || fail "within the bound, a run was evicted: $e"
# A named run evicted: its next request finds it in the store, its call
# out, and the result of that call (read only when the run waits for one)
# is decided: in its trace, and the conversation goes on.
e=$(client conversation.mjs MODE=evict OTHERS=3 A_RUN=named-evicted BASE_URL="$lru_URL/v1") || fail "evict named: $e"
[ "$(echo "$e" | get '[d["a1"]["run"], d["a2"]["run"]]')" = '["named-evicted", "named-evicted"]' ] || fail "evict named: $e"
echo "$e" | get 'd["a2"]["text"]' | grep_q '^Done: {"customer_id":"c-1"' || fail "evict named: the conversation did not go on: $e"
curl -sf "$lru_URL/v1/runs/named-evicted/trace" | grep '"type":"result"' | grep_q '"status":"progress"' ||
  fail "evict named: the result after the eviction is not in the trace: $(curl -sf "$lru_URL/v1/runs/named-evicted/trace")"
stop_server lru

note "a store busy when the answer comes (another process holds its write lock past the busy timeout): decided again a step at a time, nothing lost"
# hold_lock DB LOCKED RUN [GO]: holds the store's write lock from another
# process, touches LOCKED once it has it, and lets it go once the log
# says RUN's batch failed (it waited the busy timeout in vain; the steps
# one at a time wait again) and GO exists, when given: the lock is held
# for what it must see, not for a guess at how long that takes.
hold_lock() {
  python3 -c '
import os, sqlite3, sys, time
db, locked, log, run = sys.argv[1:5]
go = sys.argv[5] if len(sys.argv) > 5 else None
c = sqlite3.connect(db, isolation_level=None, timeout=10)
c.execute("BEGIN IMMEDIATE")
open(locked, "w").close()
end = time.monotonic() + 60
def failed():
    with open(log) as f:
        return any("\"batch_retried\"" in l and "\"run_id\":\"%s\"" % run in l for l in f)
while not (failed() and (go is None or os.path.exists(go))):
    if time.monotonic() > end:
        sys.exit("the batch of %s never failed" % run)
    time.sleep(0.02)
c.execute("ROLLBACK")' "$@"
}
# One daemon (--threads 1): the health checks below share the gateway
# request's loop. A lock is waited for 2 s (the URL's busy_timeout_ms).
start_server busy --store "sqlite:$TMP/busy.db?busy_timeout_ms=2000" --upstream "$FAKE/v1" --log "$TMP/busy.log" --threads 1
# The "slow" model answers after 3 s; the lock is taken at 1 s (after the
# model call's transaction) and held until the answer's batch (usage,
# text) has waited in vain; the step at a time that follows gets it.
curl -s --max-time 40 -H 'Content-Type: application/json' -H 'X-Loopguard-Run: busy-1' -o "$TMP/busy.json" \
  -d '{"model":"slow","messages":[{"role":"user","content":"Say hello."}]}' "$busy_URL/v1/chat/completions" &
cpid=$!
sleep 1
hold_lock "$TMP/busy.db" "$TMP/busy1.locked" "$TMP/busy.log" busy-1 || fail "busy: the lock's holder failed (above: the lock not taken, or the batch never failed)"
wait "$cpid" || fail "busy: the request failed"
get 'd["choices"][0]["message"]["content"]' <"$TMP/busy.json" | grep_q '^Hello from the fake upstream' || fail "busy: $(cat "$TMP/busy.json")"
grep -q '"batch_retried"' "$TMP/busy.log" || fail "busy: the batch did not fail, nothing was tested: $(cat "$TMP/busy.log")"
grep -q '"usage_not_settled"' "$TMP/busy.log" && fail "busy: the usage was lost: $(cat "$TMP/busy.log")"
curl -sf "$busy_URL/v1/runs/busy-1/trace" >"$TMP/busy.jsonl" || fail "busy: no trace"
for t in model usage text; do
  grep -q "\"type\":\"$t\"" "$TMP/busy.jsonl" || fail "busy: no $t line in the trace: $(cat "$TMP/busy.jsonl")"
done
"$LG_BIN" replay --json "$TMP/busy.jsonl" >"$TMP/busy.replay" || fail "busy: replay"

note "a store busy when a tool result comes (the results and the model call fail as one transaction): decided again a step at a time, the result kept"
turn1='{"model":"finish","messages":[{"role":"user","content":"look c-1 up"}]}'
id=$(curl -sf -H 'content-type: application/json' -H 'X-Loopguard-Run: busy-2' -d "$turn1" "$busy_URL/v1/chat/completions" |
  get 'd["choices"][0]["message"]["tool_calls"][0]["id"]') || fail "busy-2: the first turn"
# The lock is held until the batch of the second turn (its result, the
# model call) has waited the busy timeout in vain and the health check
# below is done; the step at a time that follows gets it. The request
# leaves once the lock is held (busy2.locked), however long python takes
# to start on a busy machine.
hold_lock "$TMP/busy.db" "$TMP/busy2.locked" "$TMP/busy.log" busy-2 "$TMP/busy2.go" &
lpid=$!
for _ in $(seq 200); do [ -e "$TMP/busy2.locked" ] && break; sleep 0.05; done
[ -e "$TMP/busy2.locked" ] || fail "busy-2: the store's lock was not taken in 10 s"
body="{\"model\":\"finish\",\"messages\":[{\"role\":\"user\",\"content\":\"look c-1 up\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"$id\",\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"arguments\":\"{\\\"customer_id\\\":\\\"c-1\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"$id\",\"content\":\"Customer 1, gold\"}]}"
curl -s --max-time 40 -o "$TMP/busy2.json" -w '%{http_code}' -H 'content-type: application/json' \
  -H 'X-Loopguard-Run: busy-2' -d "$body" "$busy_URL/v1/chat/completions" >"$TMP/busy2.code" &
cpid=$!
# The thread that read the request (the loop's leader) waits for the lock
# in the store: it passes the loop on first, so the loop's other
# connections are answered meanwhile (503: the store cannot take a write).
sleep 0.5
r=$(curl -s -o "$TMP/busy2.health" -w '%{http_code} %{time_total}' --max-time 10 "$busy_URL/healthz")
touch "$TMP/busy2.go"
[ "${r%% *}" = 503 ] || fail "busy-2: healthz while the store is locked: $r $(cat "$TMP/busy2.health")"
awk -v s="${r#* }" 'BEGIN { exit !(s < 1) }' ||
  fail "busy-2: healthz waited ${r#* } s behind a gateway request's wait for the store"
wait "$cpid"
code=$(cat "$TMP/busy2.code")
wait "$lpid" || fail "busy-2: the lock's holder failed (above: the lock not taken, or the batch never failed)"
[ "$code" = 200 ] || fail "busy-2: the second turn answered $code: $(cat "$TMP/busy2.json")"
get 'd["choices"][0]["message"]["content"]' <"$TMP/busy2.json" | grep_q '^Done: Customer 1, gold' || fail "busy-2: $(cat "$TMP/busy2.json")"
grep '"batch_retried"' "$TMP/busy.log" | grep_q '"run_id":"busy-2"' ||
  fail "busy-2: the batch did not fail, nothing was tested: $(cat "$TMP/busy.log")"
curl -sf "$busy_URL/v1/runs/busy-2/trace" >"$TMP/busy2.jsonl" || fail "busy-2: no trace"
grep '"type":"result"' "$TMP/busy2.jsonl" | grep_q "\"call_id\":\"$id\"" ||
  fail "busy-2: the result was lost: $(cat "$TMP/busy2.jsonl")"
[ "$(grep -c '"type":"model"' "$TMP/busy2.jsonl")" = 2 ] || fail "busy-2: not two model calls: $(cat "$TMP/busy2.jsonl")"
"$LG_BIN" replay --json "$TMP/busy2.jsonl" >"$TMP/busy2.replay" || fail "busy-2: replay"
stop_server busy

note "a slow upstream: the thread that read the request waits for it on the loop too, and serves the loop's other connections meanwhile"
start_server lead --store memory: --upstream "$FAKE/v1" --log "$TMP/lead.log" --threads 1
curl -s --max-time 20 -o "$TMP/lead-slow.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d '{"model":"slow","messages":[{"role":"user","content":"Say hello."}]}' "$lead_URL/v1/chat/completions" >"$TMP/lead-slow.code" &
cpid=$!
sleep 0.5
for probe in healthz gateway metrics; do
  case $probe in
  healthz) r=$(curl -s -o "$TMP/lead.out" -w '%{http_code} %{time_total}' --max-time 10 "$lead_URL/healthz") ;;
  metrics) r=$(curl -s -o "$TMP/lead.out" -w '%{http_code} %{time_total}' --max-time 10 "$lead_URL/metrics") ;;
  gateway) r=$(curl -s -o "$TMP/lead.out" -w '%{http_code} %{time_total}' --max-time 10 -H 'Content-Type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"Say hello."}]}' "$lead_URL/v1/chat/completions") ;;
  esac
  [ "${r%% *}" = 200 ] || fail "lead: $probe while a slow upstream is awaited: $r $(head -c 300 "$TMP/lead.out")"
  awk -v s="${r#* }" 'BEGIN { exit !(s < 1) }' || fail "lead: $probe waited ${r#* } s behind a slow upstream"
done
kill -0 "$cpid" 2>/dev/null || fail "lead: the slow request was answered before the checks: nothing was tested"
wait "$cpid"
[ "$(cat "$TMP/lead-slow.code")" = 200 ] || fail "lead: the slow request: $(cat "$TMP/lead-slow.code") $(cat "$TMP/lead-slow.json")"
stop_server lead

# N requests at once to a model that answers after 3 s (run N, name):
# each must be answered 200, and none may take LIMIT s [5.5] or more by
# its own clock (a request that waited behind another's 3 s takes 6):
# each request's own time, not the whole's, so that a loaded machine's
# slowness to start them is not counted (until session 41 the whole was
# timed, and a loaded CI machine failed it). The N come from one process,
# at-once.py, connected before any sends (until session 42, N curls: 120
# processes to start). Sets started to the workers the server has
# started then.
slow_at_once() { # N NAME URL_VAR [LIMIT]
  local n=$1 name=$2 limit=${4:-5.5} i r
  python3 "$HERE_SRC/at-once.py" "$n" "${!3}/v1/chat/completions" \
    '{"model":"slow","messages":[{"role":"user","content":"Say hello."}]}' "$TMP/$name" ||
    fail "$name: at-once.py failed"
  for i in $(seq "$n"); do
    r=$(cat "$TMP/$name-$i.code")
    [ "${r%% *}" = 200 ] || fail "$name: request $i: $r $(head -c 300 "$TMP/$name-$i.json")"
    awk -v s="${r#* }" -v l="$limit" 'BEGIN { exit !(s < l) }' ||
      fail "$name: request $i of $n at once (3 s each) took ${r#* } s: it waited for another"
  done
  curl -sf "${!3}/metrics" >"$TMP/$name.metrics" || fail "$name: no metrics"
  started=$(awk '$1 ~ /^loopguard_gateway_workers\{/ { n += $2 } END { print n + 0 }' "$TMP/$name.metrics")
  grep -qx 'loopguard_gateway_workers_max 20' "$TMP/$name.metrics" || fail "$name: workers_max: $(grep workers "$TMP/$name.metrics")"
}

note "many slow upstream requests at once: the loop's leader holds each on a fiber of its own (no worker needed), and those past LOOPGUARD_GATEWAY_FIBERS go to the workers"
# 80 at once with 64 fibers: 64 on the leader's fibers, 16 to the
# workers, which grow from 8 to 16 (without fibers, to the cap of 20: the
# pool test below).
LOOPGUARD_GATEWAY_FIBERS=64 LOOPGUARD_GATEWAY_WORKERS=20 start_server fib64 --store memory: --upstream "$FAKE/v1" --log "$TMP/fib64.log" --threads 1
slow_at_once 80 fib80 fib64_URL
[ "$started" -ge 16 ] && [ "$started" -le 18 ] || fail "fib80: $started workers started for the 16 requests past the leader's 64 fibers"
stop_server fib64
# 120 at once with the default (256): all on the leader's fibers, no
# worker started past the first eight (until session 34, with 64, 56
# went to the workers, and 20 of them took 11 s), each request on a
# fiber made once (fibers kept for later requests: reuse.sh). Starting
# 120 curls takes a few seconds of a loaded CI machine (6.2 s once in
# all, when the whole was timed): the workers started are the test, each
# request's time a bound.
LOOPGUARD_GATEWAY_WORKERS=20 start_server fib --store memory: --upstream "$FAKE/v1" --log "$TMP/fib.log" --threads 1
slow_at_once 120 fib120 fib_URL
# (8 start with the server; 2 more allowed should the lead pass to a
# worker on a loaded machine; with 64 fibers it is the cap, 20)
[ "$started" -le 10 ] || fail "fib120: $started workers started; the leader's 256 fibers hold 120 requests"
made=$(awk '$1 == "loopguard_gateway_fibers_made_total" { print $2 }' "$TMP/fib120.metrics")
[ "$made" -ge 100 ] && [ "$made" -le 120 ] || fail "fib120: $made fibers made for 120 requests at once"
note "a fresh run is written with its first step: its request makes two transactions (the person's message with the model call; the usage with the answer), not three"
batches() { curl -sf "$fib_URL/metrics" | awk '$1 == "loopguard_commit_batches_total" { print $2 }'; }
b0=$(batches)
for i in 1 2 3 4 5; do
  code=$(curl -s -o "$TMP/born-$i.json" -w '%{http_code}' -H 'Content-Type: application/json' -H "X-Loopguard-Run: born-$i" \
    -d '{"model":"m","messages":[{"role":"user","content":"Say hello."}]}' "$fib_URL/v1/chat/completions")
  [ "$code" = 200 ] || fail "born: request $i: $code $(head -c 300 "$TMP/born-$i.json")"
done
b1=$(batches)
[ "$((b1 - b0))" = 10 ] || fail "born: 5 fresh runs' requests made $((b1 - b0)) transactions, not 10"
for i in 1 5; do # each in the store, its trace from the creation on
  curl -sf "$fib_URL/v1/runs/born-$i/trace" >"$TMP/born-$i.trace" || fail "born: run born-$i is not in the store"
  grep -v "^#" "$TMP/born-$i.trace" | head -n 1 | grep_q '"type":"run"' || fail "born: born-$i's trace does not start with its run: $(head -c 200 "$TMP/born-$i.trace")"
done
stop_server fib

note "the same without fibers (LOOPGUARD_GATEWAY_FIBERS=0): the worker pool grows past its first eight, up to LOOPGUARD_GATEWAY_WORKERS, so none waits for another's upstream"
# 20 at once: with the first eight workers (and the loop's leader)
# alone, three rounds, 9 s; grown, one.
LOOPGUARD_GATEWAY_FIBERS=0 LOOPGUARD_GATEWAY_WORKERS=20 start_server pool --store memory: --upstream "$FAKE/v1" --log "$TMP/pool.log" --threads 1
slow_at_once 20 pool pool_URL
[ "$started" -ge 19 ] && [ "$started" -le 20 ] || fail "pool: $started workers started for 20 requests at once (the cap is 20)"
stop_server pool
note "past the queue (LOOPGUARD_GATEWAY_QUEUE): 503 overloaded in each API's shape with Retry-After, nothing decided for it, and the server keeps serving"
# Room for three: the leader's one (no fibers), the one worker's, one
# waiting. Three slow requests take it, each sent once the one before has
# its place (the gauges say); six more at once are refused.
LOOPGUARD_GATEWAY_FIBERS=0 LOOPGUARD_GATEWAY_WORKERS=1 LOOPGUARD_GATEWAY_QUEUE=1 start_server ovl --store memory: --upstream "$FAKE/v1" --log "$TMP/ovl.log" --threads 1
gauge_is() { # NAME VALUE: until the server's gauge NAME is VALUE (10 s)
  local k
  for k in $(seq 200); do
    [ "$(curl -sf "$ovl_URL/metrics" | awk -v k="$1" '$1 == k { print $2 }')" = "$2" ] && return 0
    sleep 0.05
  done
  fail "overloaded: $1 never became $2"
}
pids=()
for i in 1 2 3; do
  curl -s --max-time 30 -o /dev/null -H 'Content-Type: application/json' \
    -d '{"model":"slow","messages":[{"role":"user","content":"Say hello."}]}' "$ovl_URL/v1/chat/completions" &
  pids+=($!)
  case $i in
  1) sleep 0.3 ;; # the leader's: no gauge shows it
  2) gauge_is 'loopguard_gateway_workers{state="busy"}' 1 ;;
  3) gauge_is loopguard_gateway_queued 1 ;;
  esac
done
for i in 1 2 3 4 5 6; do
  case $((i % 3)) in
  0) path=/v1/chat/completions b='{"model":"finish","messages":[{"role":"user","content":"Hi."}]}' ;;
  1) path=/v1/messages b='{"model":"finish","max_tokens":64,"messages":[{"role":"user","content":"Hi."}]}' ;;
  2) path=/v1/responses b='{"model":"finish","input":"Hi."}' ;;
  esac
  curl -s --max-time 30 -D "$TMP/ovl-$i.head" -o "$TMP/ovl-$i.json" -H 'Content-Type: application/json' -H 'anthropic-version: 2023-06-01' \
    -H "X-Loopguard-Run: ovl-$i" -d "$b" "$ovl_URL$path" &
  pids+=($!)
done
wait "${pids[@]}"
refused=0
for i in 1 2 3 4 5 6; do
  code=$(head -n 1 "$TMP/ovl-$i.head" | awk '{print $2}')
  [ "$code" = 200 ] && continue
  [ "$code" = 503 ] || fail "overloaded: request $i: $code $(cat "$TMP/ovl-$i.json")"
  refused=$((refused + 1))
  grep -qi '^retry-after: 1' "$TMP/ovl-$i.head" || fail "overloaded: request $i: no Retry-After: $(cat "$TMP/ovl-$i.head")"
  if [ $((i % 3)) = 1 ]; then
    want='d["type"] == "error" and d["error"]["type"] == "overloaded_error" and "too many requests" in d["error"]["message"]'
  else
    want='d["error"]["type"] == "server_error" and d["error"]["code"] == "overloaded"'
  fi
  [ "$(jq_py "$want" <"$TMP/ovl-$i.json")" = true ] || fail "overloaded: request $i not in its API's shape: $(cat "$TMP/ovl-$i.json")"
  code=$(curl -s -o /dev/null -w '%{http_code}' "$ovl_URL/v1/runs/ovl-$i")
  [ "$code" = 404 ] || fail "overloaded: request $i was refused, and its run is stored ($code)"
done
[ "$refused" = 6 ] || fail "overloaded: $refused of 6 requests past a full queue were refused"
code=$(curl -s -o "$TMP/ovl-after.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d '{"model":"finish","messages":[{"role":"user","content":"Hi."}]}' "$ovl_URL/v1/chat/completions")
[ "$code" = 200 ] || fail "overloaded: the next request: $code $(cat "$TMP/ovl-after.json")"
stop_server ovl
for v in 0 lots; do
  out=$(LOOPGUARD_GATEWAY_QUEUE=$v "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$FAKE/v1" 2>&1) &&
    fail "LOOPGUARD_GATEWAY_QUEUE=$v was taken: $out"
  echo "$out" | grep >/dev/null "LOOPGUARD_GATEWAY_QUEUE.*from 1 to 1048576, not \"$v\"" || fail "LOOPGUARD_GATEWAY_QUEUE=$v: $out"
done
out=$(LOOPGUARD_GATEWAY_WORKERS=lots "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$FAKE/v1" 2>&1) &&
  fail "LOOPGUARD_GATEWAY_WORKERS=lots was taken: $out"
echo "$out" | grep >/dev/null 'LOOPGUARD_GATEWAY_WORKERS.*"lots"' || fail "LOOPGUARD_GATEWAY_WORKERS=lots: $out"
for v in lots -1 1025; do
  out=$(LOOPGUARD_GATEWAY_FIBERS=$v "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$FAKE/v1" 2>&1) &&
    fail "LOOPGUARD_GATEWAY_FIBERS=$v was taken: $out"
  echo "$out" | grep >/dev/null "LOOPGUARD_GATEWAY_FIBERS.*from 0 to 1024, not \"$v\"" || fail "LOOPGUARD_GATEWAY_FIBERS=$v: $out"
done

note "a run without X-Loopguard-Run: its next request reads only its new messages, found by its first bytes"
metric() { curl -sf "$g_URL/metrics" | awk -v k="loopguard_gateway_messages_read_total{how=\"$1\"}" '$1 == k { print $2 }'; }
# a system prompt long enough (over 2 KiB) for the conversation to be found by its start
python3 - "$TMP/derived" <<'PY'
import json, sys
sysmsg = {"role": "system", "content": "You look customers up. " + "Be brief and exact. " * 120}
user = {"role": "user", "content": "look c-1 up"}
tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
def body(msgs):  # the messages first, written the same way each time, as an SDK does
    return '{"model":"finish","messages":[' + ",".join(json.dumps(m, separators=(",", ":")) for m in msgs) + \
           '],"tools":' + json.dumps(tools, separators=(",", ":")) + "}"
open(sys.argv[1] + "-1.json", "w").write(body([sysmsg, user]))
open(sys.argv[1] + ".msgs", "w").write(json.dumps([sysmsg, user]))
PY
curl -sf -D "$TMP/derived-1.h" -o "$TMP/derived-1.out" -H 'content-type: application/json' --data-binary @"$TMP/derived-1.json" \
  "$g_URL/v1/chat/completions" || fail "derived: the first turn"
drun=$(tr -d '\r' <"$TMP/derived-1.h" | awk -F': ' 'tolower($1) == "x-loopguard-run" { print $2 }')
[ -n "$drun" ] || fail "derived: no X-Loopguard-Run in the answer: $(cat "$TMP/derived-1.h")"
python3 - "$TMP/derived" <<'PY'
import json, sys
base = sys.argv[1]
msgs = json.load(open(base + ".msgs"))
tc = json.load(open(base + "-1.out"))["choices"][0]["message"]["tool_calls"][0]
turn2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [tc]},
                {"role": "tool", "tool_call_id": tc["id"], "content": "Customer 1, gold"}]
turn3 = turn2 + [{"role": "assistant", "content": "Done: Customer 1, gold"}, {"role": "user", "content": "and c-2?"}]
tools = '[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]'
for k, m in ((2, turn2), (3, turn3)):
    open("%s-%d.json" % (base, k), "w").write('{"model":"finish","messages":[' +
        ",".join(json.dumps(x, separators=(",", ":")) for x in m) + '],"tools":' + tools + "}")
PY
for k in 2 3; do
  reused0=$(metric reused) checked0=$(metric checked)
  curl -sf -D "$TMP/derived-$k.h" -o "$TMP/derived-$k.out" -H 'content-type: application/json' \
    --data-binary @"$TMP/derived-$k.json" "$g_URL/v1/chat/completions" || fail "derived: turn $k"
  r=$(tr -d '\r' <"$TMP/derived-$k.h" | awk -F': ' 'tolower($1) == "x-loopguard-run" { print $2 }')
  [ "$r" = "$drun" ] || fail "derived: turn $k went to run '$r', not $drun"
  get 'd["choices"][0]["message"]["content"]' <"$TMP/derived-$k.out" | grep_q '^Done: Customer 1, gold' ||
    fail "derived: turn $k answered $(cat "$TMP/derived-$k.out")"
  reused=$(($(metric reused) - reused0)) checked=$(($(metric checked) - checked0))
  # turn 2 reads its 4 messages (nothing kept from a run's first request);
  # turn 3 takes those 4 as turn 2 read them and checks its 2 new ones
  if [ $k = 2 ]; then want="0 4"; else want="4 2"; fi
  [ "$reused $checked" = "$want" ] || fail "derived: turn $k reused $reused and checked $checked messages, not $want"
done
curl -sf "$g_URL/v1/runs/$drun/trace" >"$TMP/derived.jsonl" || fail "derived: no trace"
grep '"type":"result"' "$TMP/derived.jsonl" | grep_q '"call_id":"'"$(get 'd["choices"][0]["message"]["tool_calls"][0]["id"]' <"$TMP/derived-1.out")"'"' ||
  fail "derived: the result is not in the trace: $(cat "$TMP/derived.jsonl")"
grep -q '"type":"user"' "$TMP/derived.jsonl" || fail "derived: turn 3's message is not a user event: $(cat "$TMP/derived.jsonl")"
"$LG_BIN" replay --json "$TMP/derived.jsonl" >/dev/null || fail "derived: the trace does not replay"

note "a conversation begun before a restart, without X-Loopguard-Run: one new run from then on, and its loop stopped"
# As after a restart (or an eviction): the conversation's start is one the
# gateway never answered. Each turn of it must land on the same run, or a
# looping agent would get a fresh run, and a fresh count, every request.
python3 - "$g_URL" <<'PY' || fail "a conversation begun before a restart"
import json, sys, urllib.request
url = sys.argv[1] + "/v1/chat/completions"
tools = [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]
msgs = [{"role": "user", "content": "write record 7 (begun before the restart)"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_before_restart", "type": "function",
         "function": {"name": "write_record", "arguments": "{\"record_id\":7,\"value\":\"A\"}"}}]},
        {"role": "tool", "tool_call_id": "call_before_restart", "content": "error: the storage is read-only"}]
runs, actions = set(), []
for turn in range(8):
    req = urllib.request.Request(url, json.dumps({"model": "stubborn", "messages": msgs, "tools": tools}).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        runs.add(r.headers["X-Loopguard-Run"])
        actions.append(r.headers["X-Loopguard-Action"])
        m = json.load(r)["choices"][0]["message"]
    if not m.get("tool_calls"):
        break
    msgs.append({"role": "assistant", "content": m.get("content"), "tool_calls": m["tool_calls"]})
    for tc in m["tool_calls"]:
        msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": "error: the storage is read-only"})
print("runs %s, actions %s" % (sorted(runs), actions))
if len(runs) != 1:
    sys.exit("its turns went to %d runs" % len(runs))
if not ({"block", "stop"} & set(actions)):
    sys.exit("the loop was not stopped: %s" % actions)
PY

note "a stream's action and reason, known at its end, come as HTTP trailers (announced by Trailer:), the same as a whole answer's headers"
# curl writes a chunked answer's trailers into its -D file after the head;
# the same loop with stream false and true, each its own run
python3 - "$g_URL" "$TMP" <<'PY' || fail "a stream's trailers"
import json, subprocess, sys
url, tmp = sys.argv[1] + "/v1/chat/completions", sys.argv[2]
tools = [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]
seen = {}
for stream in (False, True):
    msgs, got = [{"role": "user", "content": "Write record 7."}], []
    for turn in range(8):
        body = json.dumps({"model": "stubborn", "stream": stream, "messages": msgs, "tools": tools})
        out = subprocess.run(["curl", "-sf", "-D", tmp + "/trailers.h", "-H", "content-type: application/json",
                              "-H", "X-Loopguard-Run: trailers-%d" % stream, "-d", body, url],
                             capture_output=True, text=True, check=True).stdout
        head = [l.strip() for l in open(tmp + "/trailers.h")]
        fields = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in head if ":" in l}
        if stream and fields.get("trailer") != "X-Loopguard-Action, X-Loopguard-Reason":
            sys.exit("no Trailer field announced: %s" % head)
        got.append((fields.get("x-loopguard-action"), fields.get("x-loopguard-reason")))
        calls = {}
        if stream:
            for line in out.split("\n"):
                if not line.startswith("data: {"):
                    continue
                for ch in json.loads(line[6:]).get("choices", []):
                    for tc in ch.get("delta", {}).get("tool_calls") or []:
                        e = calls.setdefault(tc["index"], {"id": None, "name": "", "args": ""})
                        e["id"] = tc.get("id") or e["id"]
                        e["name"] += tc.get("function", {}).get("name") or ""
                        e["args"] += tc.get("function", {}).get("arguments") or ""
            calls = [{"id": e["id"], "type": "function", "function": {"name": e["name"], "arguments": e["args"]}} for e in calls.values()]
        else:
            calls = json.loads(out)["choices"][0]["message"].get("tool_calls") or []
        if not calls:
            break
        msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
        msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "error: the storage is read-only"} for c in calls]
    seen[stream] = got
print(seen)
if seen[True] != seen[False] or seen[True][-1] != ("stop", "same_call_repeat"):
    sys.exit("stream false %s, stream true (trailers) %s" % (seen[False], seen[True]))
PY

note "a client's retry (the same body again within 60 s of a 200, as an SDK resends a request whose answer it lost): the same answer, no second model call, nothing decided twice"
rbody='{"model":"finish","messages":[{"role":"user","content":"Look the order o-77 up."}],"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]}'
retry_req() { curl -sf -H 'Content-Type: application/json' -H 'X-Loopguard-Run: retry-1' -d "$1" "$g_URL/v1/chat/completions"; }
retry_trace() { curl -sf "$g_URL/v1/runs/retry-1/trace" | grep -vc '^#'; }
c0=$(stats 'd["chat"]')
a1=$(retry_req "$rbody") || fail "retry: the first request"
c1=$(stats 'd["chat"]') t1=$(retry_trace)
[ "$(echo "$a1" | get 'd["choices"][0]["message"]["tool_calls"][0]["function"]["name"]')" = lookup ] || fail "retry: the first answer: $a1"
a2=$(retry_req "$rbody") || fail "retry: the retry"
c2=$(stats 'd["chat"]') t2=$(retry_trace)
[ "$a2" = "$a1" ] || fail "retry: another answer: $a2 (first: $a1)"
[ "$((c1 - c0))" = 1 ] && [ "$c2" = "$c1" ] || fail "retry: $((c1 - c0)) model calls for the first, $((c2 - c1)) for the retry"
[ "$t2" = "$t1" ] || fail "retry: the run's trace went from $t1 lines to $t2: the retry was decided again"
a3=$(retry_req "${rbody/o-77/o-78}") || fail "retry: another body"
[ "$(stats 'd["chat"]')" = "$((c2 + 1))" ] || fail "retry: a body of its own was not a model call of its own"
# the sender is every credential it sends: two Azure clients (api-key, no Authorization)
# sending the same body on one run are two requests, each a model call of its own;
# each one's own retry is a retry (until session 45 only x-api-key told senders apart)
retry_as() { curl -sf -H 'Content-Type: application/json' -H 'X-Loopguard-Run: retry-2' -H "$1" -d "$rbody" "$g_URL/v1/chat/completions" >/dev/null; }
c3=$(stats 'd["chat"]')
retry_as 'api-key: azure-a' && retry_as 'api-key: azure-b' || fail "retry: the api-key requests"
[ "$(stats 'd["chat"]')" = "$((c3 + 2))" ] || fail "retry: another api-key's request got the first one's answer ($(( $(stats 'd["chat"]') - c3 )) model calls for 2 senders)"
retry_as 'api-key: azure-b' || fail "retry: the api-key retry"
[ "$(stats 'd["chat"]')" = "$((c3 + 2))" ] || fail "retry: the same api-key's retry was a model call"

note "the upstream never saw a conversation a provider rejects"
fakes_clean
curl -sf "$g_URL/healthz" >/dev/null || fail "the server stopped serving"
stop_server g
echo "PASS"
