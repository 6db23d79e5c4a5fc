#!/usr/bin/env bash
# replicas.sh — two gateways on one store, an agent's requests going to
# each in turn (a round-robin balancer, no sticky sessions): one run, and
# its guards whole, as through one gateway.
#
# Asserts, on a sqlite: file (LG_TEST_STORE=postgres, under
# tests/pg/with-postgres.sh: on PostgreSQL):
#   - an agent looping on a failing write, on each API, stream and not,
#     its run derived from the conversation and named by X-Loopguard-Run:
#     the write runs twice at most and the agent ends with the final
#     message; every answer names one run (the conversation's start and
#     Responses ids are found in the store by the replica that did not
#     answer them: lg_gateway_keys);
#   - episodes across replicas: a loop stopped, the person writes again
#     (the run resumes), it loops and stops again, and requests without a
#     new message stay stopped: the trace holds one `user` event and one
#     `resume` (a replica that had not seen a request does not take the
#     person's old message for a new one), and replays to the same end;
#   - Responses by previous_response_id: the person goes on from the stop's
#     answer (the gateway's own, which no upstream has) on the replica
#     that did not make it; an answer's refused call, which the upstream's
#     stored response (or conversation: the Agents SDK's conversationId)
#     holds unanswered, answered by the replica the next request comes to,
#     and so is a call the run stopped on, when the person asks again;
#   - a conversation named by X-Loopguard-Run, stopped on one replica: the
#     person's next message resumes it on the other, which never saw it;
#   - the run's memory: the replica a request comes to sends upstream the
#     steer note and the restored calls the other decided, every request's
#     upstream body as through one gateway (each API);
#   - a server restarted on the store goes on with a conversation it
#     answered before (its table of runs is gone, the store's keys are not),
#     and so does one that evicted it from memory;
#   - a run purged by `loopguard runs purge` while its conversation goes
#     on: the server that held it makes it again under its id (with its
#     keys), and the other replica finds it;
#   - (SQLite) a store that refuses the keys: a warning naming the run and
#     the store's message, and the conversation goes on from memory.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the fake upstream: FAKE

STORE="sqlite:$TMP/replicas.db"
if [ "${LG_TEST_STORE:-}" = postgres ]; then
  [ -n "${LG_PG_URL:-}" ] || { echo "SKIP: no LG_PG_URL (run under tests/pg/with-postgres.sh)"; exit 77; }
  STORE=$LG_PG_URL
fi
mkdir -p "$TMP/policies"
echo '{"cascade":{"escalate":{"model":"stubborn-strong","turns":3}}}' >"$TMP/policies/escalate.json"
start_server r1 --store "$STORE" --upstream "$FAKE/v1" --log "$TMP/r1.log" --policies "$TMP/policies"
start_server r2 --store "$STORE" --upstream "$FAKE/v1" --log "$TMP/r2.log" --policies "$TMP/policies"
BOTH="$r1_URL,$r2_URL"

# one_run LABEL JSON: the answers the agent saw (non-stream) name one run
one_run() {
  [ "$(echo "$2" | jq_py 'len(set(s["run"] for s in d["seen"])) == 1 and len(d["seen"]) >= 2')" = true ] ||
    fail "$1: not one run: $2"
}

# (functions: Chat Completions' older function calling, its conversation known by its
# start's hash, which both replicas find in the store)
for api in chat messages responses functions; do
  base=$r1_URL/v1
  [ $api = messages ] && base=$r1_URL
  for stream in 0 1; do
    note "$api, stream $stream, derived run: the write twice at most, through both replicas"
    out=$(client agent-guard.mjs API=$api STREAM=$stream BASE_URL="$base" BASE_URLS="$BOTH") || fail "$api $stream: $out"
    stopped "$api stream $stream derived" "$out"
    [ $stream = 1 ] || one_run "$api derived" "$out"
    note "$api, stream $stream, X-Loopguard-Run: the same"
    out=$(client agent-guard.mjs API=$api STREAM=$stream BASE_URL="$base" BASE_URLS="$BOTH" \
      HEADERS="{\"X-Loopguard-Run\":\"rr-$api-$stream\"}") || fail "$api $stream named: $out"
    stopped "$api stream $stream named" "$out"
    [ $stream = 1 ] || one_run "$api named" "$out"
  done
done
# Both replicas answered: the balancing is real (each served its share).
for r in r1 r2; do
  url_var=${r}_URL
  n=$(curl -sf "${!url_var}/metrics" | awk '/^loopguard_gateway_requests_total/ {s += $2} END {print s + 0}')
  [ "$n" -ge 12 ] || fail "replica $r served $n gateway requests"
done

for stream in 0 1; do
  note "Responses by previous_response_id, stream $stream: the person goes on from the stop's answer on the other replica"
  # The stop's final answer is the gateway's own (resp_lg...): no upstream
  # has it, and the replica that did not make it reads from the store what
  # to send upstream instead (it sent the id, and the upstream refused it).
  out=$(client agent-responses.mjs MODEL=stubborn MODEL2=finish STREAM=$stream BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH" \
    FOLLOW_UP="The storage is writable now; please look customer c-1 up instead.") || fail "responses chain $stream: $out"
  [ "$(echo "$out" | jq_py 'd["ended"]')" = final ] || fail "responses chain $stream: not stopped: $out"
  [ "$(echo "$out" | jq_py 'd["follow"].get("error")')" = null ] || fail "responses chain $stream: the follow-up failed: $out"
  [ "$(echo "$out" | jq_py 'd["follow"]["action"]')" = pass ] || fail "responses chain $stream: $out"
  [ $stream = 1 ] || [ "$(echo "$out" | jq_py 'd["follow"]["run"] == d["seen"][0]["run"]')" = true ] ||
    fail "responses chain: the follow-up went to another run: $out"
done

for stream in 0 1; do
  # An answer with one call refused and one kept: the client continues from
  # the upstream's response, which holds the refused call unanswered; the
  # gateway answers it for the upstream, on the replica the request comes
  # to (the upstream refuses a call left without its output: 400).
  note "Responses by previous_response_id, stream $stream: an answer's refused call answered on the other replica"
  out=$(client agent-responses.mjs MODEL=pair STREAM=$stream BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH") || fail "responses pair $stream: $out"
  [ "$(echo "$out" | jq_py 'd["ended"]')" = final ] || fail "responses pair $stream: $out"
  # the screens a computer-use run has had are in the run's memory: on
  # the other replica a new screen is still progress and an old one not
  note "a computer-use run, stream $stream: each replica knows the screens the other saw"
  out=$(client agent-responses.mjs MODEL=loop-builtin BUILTIN=computer SCREENS=new STREAM=$stream BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH") ||
    fail "computer, new screens $stream: $out"
  [ "$(echo "$out" | jq_py '[d["ended"], d["executions"]["write_record"]]')" = '["step_cap", 12]' ] || fail "computer, new screens $stream: $out"
  out=$(client agent-responses.mjs MODEL=loop-builtin BUILTIN=computer SCREENS=toggle STREAM=$stream BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH") ||
    fail "computer, two screens $stream: $out"
  [ "$(echo "$out" | jq_py '[d["ended"], d["executions"]["write_record"]]')" = '["final", 4]' ] || fail "computer, two screens $stream: $out"
  # so are the outputs a polled command has printed: a build's polls (Codex's
  # write_stdin), each to the other replica, stay progress while it prints
  note "a build polled, stream $stream: each replica knows the output the other saw"
  out=$(client agent-responses.mjs MODEL=poll SHELL_TOOLS=exec STREAM=$stream BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH") ||
    fail "poll $stream: $out"
  [ "$(echo "$out" | jq_py '[d["ended"], d["executions"]["write_stdin"]]')" = '["final", 8]' ] || fail "poll $stream: $out"
  note "the Agents SDK in a conversation (conversationId), stream $stream: the same"
  out=$(client agent-openai-agents.mjs MODEL=pair STREAM=$stream CONVERSATION=1 BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH") ||
    fail "agents conversation pair $stream: $out"
  [ "$(echo "$out" | jq_py 'd["ended"]')" = final ] || fail "agents conversation pair $stream: $out"
done

# A run stopped on a call in a conversation (this policy stops at the third
# same call): the conversation holds the call, and the person's next
# message, on the other replica, answers it with the stop's message (else
# the upstream refuses it: "No tool output found"); the run stays stopped.
echo '{"repeat":{"observe":2,"block":3,"stop":3},"tools":{"write_record":{"loop_key":{"record_id":[],"value":["lower","trim"]}}}}' >"$TMP/stop3.json"
start_server s1 --store "$STORE" --upstream "$FAKE/v1" --policy "$TMP/stop3.json" --log "$TMP/s1.log"
start_server s2 --store "$STORE" --upstream "$FAKE/v1" --policy "$TMP/stop3.json" --log "$TMP/s2.log"
for stream in 0 1; do
  note "the Agents SDK in a conversation, stream $stream: stopped on a call, asked again on the other replica"
  out=$(client agent-openai-agents.mjs MODEL=stubborn STREAM=$stream CONVERSATION=1 AGAIN=1 BASE_URL="$s1_URL/v1" \
    BASE_URLS="$s1_URL,$s2_URL") || fail "agents conversation asked again $stream: $out"
  echo "$out" | jq_py 'd["again"]' | grep_q "3 times" || fail "agents conversation asked again $stream: $out"
done
stop_server s1
stop_server s2

note "the run's memory across replicas: the upstream gets the steer note and the restored calls another replica decided, as from one gateway (each API)"
# The same conversation (derived runs, the person's message tagged), once
# through r1 and r2 in turn and once through r1 alone: every request's
# upstream body alike. Before session 37 the replica that had not decided
# the observe or the block sent the client's conversation as it was.
# Then the same with runs named by X-Loopguard-Run (the replica that never
# saw the run makes it in memory, as it does a new one).
for named in "" 1; do
two=$(RUN=${named:+mem-two} python3 "$HERE_SRC/replica-memory.py" "$FAKE" T$named "$r1_URL" "$r2_URL") || fail "replica memory, two replicas: $two"
one=$(RUN=${named:+mem-one} python3 "$HERE_SRC/replica-memory.py" "$FAKE" T$named "$r1_URL") || fail "replica memory, one gateway: $one"
python3 - "$two" "$one" <<'PY' || fail "replica memory${named:+ (named runs)}: two replicas sent upstream what one gateway did not"
import json, sys
two, one = json.loads(sys.argv[1]), json.loads(sys.argv[2])
bad = 0
for api in two:
    a, b = two[api], one[api]
    if a["actions"] != b["actions"] or a["actions"][-1] != "stop" or "block" not in a["actions"]:
        print("%s: actions %s through two replicas, %s through one" % (api, a["actions"], b["actions"])); bad = 1
    if not any("[loopguard]" in u for u in b["upstream"]):
        print("%s: no steer note reached the upstream: nothing was tested" % api); bad = 1
    for i, (x, y) in enumerate(zip(a["upstream"], b["upstream"])):
        if x != y:
            print("%s: request %d: through two replicas the upstream got\n  %s\nthrough one\n  %s" % (api, i + 1, x, y)); bad = 1
sys.exit(bad)
PY
done

note "a stored Responses conversation continued on the other replica: its worst case counts what the upstream bills again for it"
# The upstream bills a request continuing a response (previous_response_id)
# for the whole stored conversation as input: the model call's worst case
# (its model event's input_tokens) must count it on the replica that did
# not relay the answer (it counted the request's bytes alone: a budget
# could be passed by the stored conversation).
python3 - "$r1_URL" "$r2_URL" <<'PY' || fail "a continued Responses conversation's worst case on the other replica"
import json, sys, urllib.request
r1, r2 = sys.argv[1], sys.argv[2]
tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
def post(url, run, body):
    req = urllib.request.Request(url + "/v1/responses", json.dumps(body).encode(),
                                 {"content-type": "application/json", "X-Loopguard-Run": run})
    with urllib.request.urlopen(req) as r:
        return json.load(r)
def chain(run, second):  # the second model event's input_tokens, and the first usage's tokens
    a = post(r1, run, {"model": "finish", "input": "Look customer c-1 up.", "tools": tools})
    call = [o for o in a["output"] if o["type"] == "function_call"][0]
    post(second, run, {"model": "finish", "previous_response_id": a["id"], "tools": tools,
                       "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "{\"name\":\"Ada\"}"}]})
    with urllib.request.urlopen(r1 + "/v1/runs/%s/trace" % run) as r:
        lines = [json.loads(l) for l in r.read().decode().splitlines() if l and not l.startswith("#")]
    models = [l["input_tokens"] for l in lines if l["type"] == "model"]
    usage = [l for l in lines if l["type"] == "usage"][0]
    return models, usage["input_tokens"] + usage["output_tokens"]
one, stored = chain("stored-one", r1)
two, _ = chain("stored-two", r2)
# the same bodies but for the response ids, whose lengths may differ a little
if len(one) != 2 or len(two) != 2 or two[1] < one[1] - 4:
    sys.exit("the continuing request's worst case: %s input tokens through one gateway, %s through the other "
             "replica (the stored conversation holds %d)" % (one, two, stored))
PY

note "cascade.escalate across replicas: the model calls after a block are priced at the escalation's model on either replica"
# The model a call is sent to comes with each model decision; the one its
# worst case is priced at was this server's memory (a replica that had not
# seen the block priced the escalated calls at the client's model: a
# dearer model under a cheaper one's worst case).
python3 - "$r1_URL" "$r2_URL" <<'PY' || fail "escalation across replicas"
import json, sys, urllib.request
r1, r2 = sys.argv[1], sys.argv[2]
tools = [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]
def models(run, urls):
    conv = [{"role": "user", "content": "Write record 7 with value A."}]
    for i in range(8):
        req = urllib.request.Request(urls[i % len(urls)] + "/v1/chat/completions",
                                     json.dumps({"model": "stubborn", "messages": conv, "tools": tools}).encode(),
                                     {"content-type": "application/json", "X-Loopguard-Run": run, "X-Loopguard-Policy": "escalate"})
        with urllib.request.urlopen(req) as r:
            m = json.load(r)["choices"][0]["message"]
        calls = m.get("tool_calls") or []
        conv.append({"role": "assistant", "content": m.get("content"), **({"tool_calls": calls} if calls else {})})
        conv += [{"role": "tool", "tool_call_id": c["id"], "content": "Error: the storage is read-only."} for c in calls]
        if not calls:
            break
    with urllib.request.urlopen(r1 + "/v1/runs/%s/trace" % run) as r:
        return [json.loads(l)["model"] for l in r.read().decode().splitlines() if '"type":"model"' in l]
one, two = models("esc-one", [r1]), models("esc-two", [r1, r2])
if one != two or "stubborn-strong" not in one:
    sys.exit("model events through one gateway %s, through two replicas %s" % (one, two))
PY

note "a Responses conversation named by X-Loopguard-Run: stopped on one replica, the person's next message resumes it on the other"
# The other replica meets the named run for the first time; it is stored
# all the same, so the person's message is a later prompt there (before
# session 37 it was taken for the run's first, no user event: the stop
# answered again).
python3 - "$r1_URL" "$r2_URL" "$FAKE" <<'PY' || fail "a named conversation resumed on the other replica"
import json, sys, urllib.request
r1, r2, fake = sys.argv[1], sys.argv[2], sys.argv[3]
tools = [{"type": "function", "name": "write_record", "parameters": {"type": "object"}},
         {"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
def post(url, path, body):
    h = {"content-type": "application/json", "authorization": "Bearer sk-test", "X-Loopguard-Run": "conv-named-1"}
    with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), h)) as r:
        return json.load(r), r.headers.get("X-Loopguard-Action")
conv, _ = post(fake, "/v1/conversations", {})
items = [{"role": "user", "content": "Write record 7 with value A."}]
for i in range(10):
    a, act = post(r1, "/v1/responses", {"model": "stubborn", "conversation": conv["id"], "input": items, "tools": tools})
    calls = [o for o in a["output"] if o["type"] == "function_call"]
    items = [{"type": "function_call_output", "call_id": c["call_id"], "output": "Error: the storage is read-only."} for c in calls]
    if not calls:
        break
if act != "stop":
    sys.exit("the loop did not stop on r1: %s" % act)
a, act = post(r2, "/v1/responses", {"model": "finish", "conversation": conv["id"], "tools": tools,
                                    "input": [{"role": "user", "content": "The storage is writable now; look customer c-1 up."}]})
if act == "stop":
    sys.exit("the person's new message on r2 was answered with the stop again: %s" % json.dumps(a["output"])[:300])
PY

note "a conversation's stream cut at a text loop on one replica: what that request sent is sent again by the other"
# The upstream keeps nothing of a stream its client left, the request's
# input included: the replica that cut it keeps that input in the store
# (answers:conv), and the next request, on the other replica, sends it
# first; else the conversation holds a call without its output, and the
# upstream refuses the request ("No tool output found"), and the person's
# message in it is gone.
python3 - "$r1_URL" "$r2_URL" "$FAKE" <<'PY' || fail "a conversation's cut stream, then the other replica"
import json, sys, urllib.request
r1, r2, fake = sys.argv[1], sys.argv[2], sys.argv[3]
tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
def post(url, path, body, stream=False):
    h = {"content-type": "application/json", "authorization": "Bearer sk-test", "X-Loopguard-Run": "conv-cut-1"}
    with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), h)) as r:
        if stream:
            return [json.loads(l[6:]) for l in r.read().decode().splitlines() if l.startswith("data: {")]
        return json.load(r)
conv = post(fake, "/v1/conversations", {})
a = post(r1, "/v1/responses", {"model": "call-chant", "conversation": conv["id"], "tools": tools,
                               "input": [{"role": "user", "content": "Look customer c-1 up."}]})
calls = [o for o in a["output"] if o["type"] == "function_call"]
if len(calls) != 1:
    sys.exit("call-chant asked for %d calls: %s" % (len(calls), json.dumps(a)[:300]))
evs = post(r1, "/v1/responses", {"model": "call-chant", "conversation": conv["id"], "tools": tools, "stream": True,
                                 "input": [{"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "Ada"},
                                           {"role": "user", "content": "And be quick."}]}, stream=True)
text = "".join(e.get("delta", "") for e in evs if e["type"] == "response.output_text.delta")
if not evs or evs[-1]["type"] != "response.completed" or not 0 < text.count("Waiting for the payment.") < 40:
    sys.exit("the text loop's stream was not cut and ended: %s" % json.dumps(evs[-1:])[:300])
a = post(r2, "/v1/responses", {"model": "finish", "conversation": conv["id"], "tools": tools,
                               "input": [{"role": "user", "content": "Thanks. Who was it?"}]})
# what the cut request carried, in its order, then the new request's
with urllib.request.urlopen(fake + "/stats") as r:
    sent = [b for b in json.load(r)["bodies"] if b.get("model") == "finish"][-1]["input"]
got = [i.get("output") or i.get("content") for i in sent]  # the last with the text loop's steer
if got[:2] != ["Ada", "And be quick."] or len(got) != 3 or not got[2].startswith("Thanks. Who was it?"):
    sys.exit("the request after the cut sent the upstream %s" % json.dumps(sent)[:400])
PY

note "episodes across replicas: one user event, one resume; the stop holds without a new message"
e=$(client conversation.mjs MODE=episode MODEL=stubborn MODEL2=stubborn AFTER=8 BASE_URL="$r1_URL/v1" BASE_URLS="$BOTH") ||
  fail "episode: $e"
run=$(echo "$e" | jq_py 'd["first"]["run"]')
[ "$(echo "$e" | jq_py 'd["first"]["action"]')" = stop ] || fail "episode: the first loop did not stop: $e"
[ "$(echo "$e" | jq_py 'len(set([d["first"]["run"], d["second"]["run"]] + [a["run"] for a in d["after"]]))')" = 1 ] ||
  fail "episode: another run: $e"
[ "$(echo "$e" | jq_py 'd["after"][-1]["action"]')" = stop ] || fail "episode: the second loop did not stop: $e"
[ "$(echo "$e" | jq_py 'all(a["calls"] == 0 for a in d["after"][-2:])')" = true ] ||
  fail "episode: calls after the second stop: $e"
curl -sf "$r2_URL/v1/runs/$run/trace" >"$TMP/episode.jsonl" || fail "trace $run"
users=$(grep -c '"type":"user"' "$TMP/episode.jsonl")
resumes=$(grep -c '"type":"resume"' "$TMP/episode.jsonl")
[ "$users" = 1 ] && [ "$resumes" = 1 ] ||
  fail "episode trace: $users user events and $resumes resumes, not 1 and 1: $(cat "$TMP/episode.jsonl")"
"$LG_BIN" replay --json "$TMP/episode.jsonl" >"$TMP/episode.replay" || fail "replay $run"
[ "$(jq_url "$r1_URL/v1/runs/$run" 'd["terminal_reason"]')" = \
  "$(tail -n 1 "$TMP/episode.replay" | jq_py 'd["terminal_reason"]')" ] ||
  fail "episode replay: $(tail -n 1 "$TMP/episode.replay") against $(curl -sf "$r1_URL/v1/runs/$run")"

note "a restart: the server goes on with a conversation it answered before"
# A conversation started on r1, then r1 restarted before its next request
# (the store's keys find the run, the store's run its turns).
body='{"model":"stubborn","messages":[{"role":"user","content":"Write record 7 with value A."}],"tools":[{"type":"function","function":{"name":"write_record","parameters":{"type":"object"}}}]}'
ans=$(curl -sf -D "$TMP/h1" -H 'Content-Type: application/json' -d "$body" "$r1_URL/v1/chat/completions") || fail "restart: first request"
run1=$(awk 'tolower($1) == "x-loopguard-run:" {print $2}' "$TMP/h1" | tr -d '\r')
stop_server r1
start_server r1 --store "$STORE" --upstream "$FAKE/v1" --log "$TMP/r1b.log"
conv=$(echo "$ans" | python3 -c 'import json, sys
m = json.load(sys.stdin)["choices"][0]["message"]
results = [{"role": "tool", "tool_call_id": c["id"], "content": "Error: the storage is read-only."} for c in m["tool_calls"]]
print(json.dumps({"model": "stubborn", "tools": [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}],
                  "messages": [{"role": "user", "content": "Write record 7 with value A."}, m] + results}))') || fail "restart: $ans"
curl -sf -D "$TMP/h2" -o /dev/null -H 'Content-Type: application/json' -d "$conv" "$r1_URL/v1/chat/completions" || fail "restart: second request"
run2=$(awk 'tolower($1) == "x-loopguard-run:" {print $2}' "$TMP/h2" | tr -d '\r')
act2=$(awk 'tolower($1) == "x-loopguard-action:" {print $2}' "$TMP/h2" | tr -d '\r')
[ -n "$run1" ] && [ "$run1" = "$run2" ] || fail "restart: the conversation's second request went to run $run2, not $run1"
[ "$act2" = observe ] || fail "restart: the same write again was $act2, not observe (its turn taken for the first's?)"

note "a run purged (loopguard runs purge) while its conversation goes on: made again under its id, on the server that held it and on the other"
# r1 holds the run in memory; the purge deletes its row, its trace and the
# store's keys. r1's next request makes it again (not a 500 on every later
# request), writes its keys again, and r2 finds it by them.
ans=$(curl -sf -D "$TMP/p1" -H 'Content-Type: application/json' -d "${body/record 7/record 9}" "$r1_URL/v1/chat/completions") ||
  fail "purge: first request"
prun=$(awk 'tolower($1) == "x-loopguard-run:" {print $2}' "$TMP/p1" | tr -d '\r')
out=$("$LG_BIN" runs purge --older-than 0s --store "$STORE") || fail "purge: $out"
echo "$out" | grep -Eq '^purged [0-9]+ runs? not written to for 0s' || fail "purge: $out"
"$LG_BIN" runs show "$prun" --store "$STORE" >/dev/null 2>&1 && fail "purge: run $prun is still in the store"
# next MESSAGES ANSWER: the conversation with ANSWER's calls answered
next_conv() {
  python3 -c 'import json, sys
msgs = json.loads(sys.argv[1]); m = json.loads(sys.argv[2])["choices"][0]["message"]
msgs += [m] + [{"role": "tool", "tool_call_id": c["id"], "content": "Error: the storage is read-only."} for c in m["tool_calls"]]
print(json.dumps(msgs))' "$1" "$2"
}
msgs=$(next_conv '[{"role":"user","content":"Write record 9 with value A."}]' "$ans") || fail "purge: $ans"
conv_of() { echo "{\"model\":\"stubborn\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"write_record\",\"parameters\":{\"type\":\"object\"}}}],\"messages\":$1}"; }
ans=$(curl -s -D "$TMP/p2" -H 'Content-Type: application/json' -d "$(conv_of "$msgs")" "$r1_URL/v1/chat/completions")
grep -q '^HTTP/1.1 200' "$TMP/p2" || fail "purge: the conversation's next request on r1: $(head -1 "$TMP/p2") $ans"
[ "$(awk 'tolower($1) == "x-loopguard-run:" {print $2}' "$TMP/p2" | tr -d '\r')" = "$prun" ] ||
  fail "purge: r1 answered in another run than $prun: $(cat "$TMP/p2")"
grep '"run_gone"' "$TMP/r1b.log" | grep_q "\"run_id\":\"$prun\"" || fail "purge: r1 logged no run_gone for $prun"
curl -sf "$r1_URL/v1/runs/$prun/trace" | grep -v '^#' | head -n 1 | grep_q '"type":"run"' ||
  fail "purge: $prun was not made again with its first line: $(curl -s "$r1_URL/v1/runs/$prun/trace")"
msgs=$(next_conv "$msgs" "$ans") || fail "purge: $ans"
curl -sf -D "$TMP/p3" -o /dev/null -H 'Content-Type: application/json' -d "$(conv_of "$msgs")" "$r2_URL/v1/chat/completions" ||
  fail "purge: the next request on r2"
[ "$(awk 'tolower($1) == "x-loopguard-run:" {print $2}' "$TMP/p3" | tr -d '\r')" = "$prun" ] ||
  fail "purge: r2 did not find the conversation's run $prun (its keys not stored again): $(cat "$TMP/p3")"
# the same write a third time in the run made again: its second there
[ "$(awk 'tolower($1) == "x-loopguard-action:" {print $2}' "$TMP/p3" | tr -d '\r')" = observe ] ||
  fail "purge: the write's second call in the new run was not observed: $(cat "$TMP/p3")"

note "an evicted conversation (past LOOPGUARD_GATEWAY_MAX_RUNS) is found again in the store: the same run"
# On memory: it goes on as a new run (guard.sh); here the store has its key.
LOOPGUARD_GATEWAY_MAX_RUNS=2 start_server lru --store "$STORE" --upstream "$FAKE/v1" --log "$TMP/lru.log"
e=$(client conversation.mjs MODE=evict OTHERS=3 BASE_URL="$lru_URL/v1") || fail "evict: $e"
[ "$(echo "$e" | jq_py 'd["a1"]["calls"]')" = 1 ] || fail "evict: $e"
echo "$e" | jq_py 'd["a2"]["text"]' | grep_q '^Done: {"customer_id":"c-1"' || fail "evict: the conversation did not go on: $e"
[ "$(echo "$e" | jq_py 'd["a1"]["run"] == d["a2"]["run"]')" = true ] || fail "evict: another run after the eviction: $e"
stop_server lru
# The same on memory: is another run: the conversation was evicted indeed.
LOOPGUARD_GATEWAY_MAX_RUNS=2 start_server lrum --store memory: --upstream "$FAKE/v1" --log "$TMP/lrum.log"
e=$(client conversation.mjs MODE=evict OTHERS=3 BASE_URL="$lrum_URL/v1") || fail "evict on memory: $e"
[ "$(echo "$e" | jq_py 'd["a1"]["run"] != d["a2"]["run"]')" = true ] || fail "evict: nothing was evicted on memory:, nothing was tested: $e"
stop_server lrum

if [ "${LG_TEST_STORE:-}" != postgres ]; then
  note "a key the store refuses: a warning, and the conversation goes on from the server's memory"
  # A trigger of the test's own makes every key write fail (the table's
  # reads still work): the server that answered keeps the conversation
  # in one run; the log names the run and the store's message.
  python3 -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
c.execute("CREATE TRIGGER no_keys BEFORE INSERT ON lg_gateway_keys BEGIN SELECT RAISE(ABORT, \"no keys today\"); END")' \
    "${STORE#sqlite:}" || fail "the trigger"
  out=$(client agent-guard.mjs API=chat BASE_URL="$r2_URL/v1") || fail "keys refused: $out"
  stopped "keys refused" "$out"
  one_run "keys refused" "$out"
  run=$(echo "$out" | jq_py 'd["seen"][0]["run"]')
  grep '"conversation_key_not_stored"' "$TMP/r2.log" | grep_q "\"run_id\":\"$run\".*no keys today" ||
    fail "keys refused: no warning naming $run and the store's message: $(grep -v '"info"' "$TMP/r2.log")"
fi

if [ "${LG_TEST_STORE:-}" = postgres ]; then
  note "a run's row locked by another session: the request waits (up to lock_timeout), and the server's other connections are answered meanwhile"
  # (SQLite's busy wait is guard.sh's busy-2, where the loop's leader
  # passes its loop on; on PostgreSQL a gateway request runs on a worker,
  # never on the HTTP thread: one HTTP thread here)
  start_server pgl --store "$STORE" --upstream "$FAKE/v1" --log "$TMP/pgl.log" --threads 1
  ask() { # OUT: a request of the run pg-locked (a body of its own: no client's retry) -> OUT.code
    curl -s --max-time 20 -o "$TMP/$1.json" -w '%{http_code}' -H 'Content-Type: application/json' \
      -H 'X-Loopguard-Run: pg-locked' -d "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello ($1).\"}]}" \
      "$pgl_URL/v1/chat/completions" >"$TMP/$1.code"
  }
  ask pgl1
  [ "$(cat "$TMP/pgl1.code")" = 200 ] || fail "row lock: the run's first request: $(cat "$TMP/pgl1.code") $(cat "$TMP/pgl1.json")"
  "$LG_PGBIN/psql" -h "$LG_PG_DIR" -U "${LG_PG_URL##*user=}" -d lgtest -Aq -c 'BEGIN' \
    -c "SELECT 1 FROM lg_runs WHERE run_id = 'pg-locked' FOR UPDATE" -c "\\! touch $TMP/pgl.locked" \
    -c 'SELECT pg_sleep(3)' -c 'COMMIT' >/dev/null 2>"$TMP/pgl.psql" &
  hold=$!
  for _ in $(seq 100); do [ -e "$TMP/pgl.locked" ] && break; sleep 0.05; done
  [ -e "$TMP/pgl.locked" ] || fail "row lock: psql did not take it: $(cat "$TMP/pgl.psql")"
  ask pgl2 &
  cpid=$!
  sleep 0.5
  r=$(curl -s -o "$TMP/pgl.health" -w '%{http_code} %{time_total}' --max-time 10 "$pgl_URL/healthz")
  [ "${r%% *}" = 200 ] || fail "row lock: healthz while a request waits for the lock: $r $(cat "$TMP/pgl.health")"
  awk -v s="${r#* }" 'BEGIN { exit !(s < 1) }' || fail "row lock: healthz waited ${r#* } s behind a request's wait for a row lock"
  kill -0 "$cpid" 2>/dev/null || fail "row lock: the request was answered before the lock was let go: nothing was tested"
  wait "$cpid"
  wait "$hold" || fail "row lock: psql: $(cat "$TMP/pgl.psql")"
  [ "$(cat "$TMP/pgl2.code")" = 200 ] || fail "row lock: the request that waited: $(cat "$TMP/pgl2.code") $(cat "$TMP/pgl2.json")"
  stop_server pgl
fi

stop_server r1
stop_server r2
fakes_clean
echo "PASS: replicas"
