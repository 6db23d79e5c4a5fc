"""text-steer.py URL FAKE — a text loop's steer note (the observe rung) is
given to the model on the next request, once (tests/gateway/guard.sh).
The fake's `chant-call` answers with a text loop and a lookup (the default
policy observes the loop), then "Done." once the lookup has its result;
`chant` streamed is cut there. For each conversation, the note must be in
the upstream's request after the observed answer, in the last message
that can carry it (the person's, a tool result), and:
  - a conversation sent whole (Chat Completions, Messages, Responses
    without previous_response_id): on that message in every later request
    too, nowhere else (a Responses input that ends with a
    function_call_output got no note before);
  - a Responses conversation the upstream keeps (previous_response_id):
    in the next request only (it was said again with every later one), or
    in the retry of that request when the upstream refused it (a 429);
  - a Responses conversation sent whole, then continued by
    previous_response_id: said with the whole input, never again;
  - continuing from the gateway's own answer (a stream cut at the loop):
    once, after that answer (its stored items held the note too, so it
    was said twice).
Exits 1 saying what is wrong."""
import json
import sys
import urllib.error
import urllib.request

url, fake = sys.argv[1], sys.argv[2]
NOTE = "[loopguard]"
bad = []


def post(path, body, run, stream=False):
    h = {"content-type": "application/json", "X-Loopguard-Run": run, "anthropic-version": "2023-06-01"}
    with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), h)) as r:
        if stream:
            events = [json.loads(l[6:]) for l in r.read().decode().splitlines() if l.startswith("data: {")]
            return [e for e in events if e.get("type") == "response.completed"][-1]["response"], r.headers.get("X-Loopguard-Action")
        return json.load(r), r.headers.get("X-Loopguard-Action")


def upstream():  # the last request the upstream got: its messages (input)
    with urllib.request.urlopen(fake + "/stats") as r:
        b = json.loads(json.load(r)["raw"][-1])
    return b.get("input", b.get("messages"))


def check(label, want_at):  # the note in the upstream's last request: once, in item want_at (None: nowhere)
    msgs = upstream()
    at = [i for i, m in enumerate(msgs) if NOTE in json.dumps(m)]
    want = [] if want_at is None else [want_at % len(msgs)]
    if at != want:
        bad.append("%s: the note is in items %s of %s, not %s: %s" % (label, at, len(msgs), want, json.dumps(msgs)[-600:]))


def observed(label, action):
    if action != "observe":
        bad.append("%s: the loop was not observed (%s): nothing was tested" % (label, action))


tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]


def whole_start(run, label):  # a Responses run sent whole: the loop observed, then the note in the next request
    inp = [{"role": "user", "content": "Pay the invoice."}]
    a, act = post("/v1/responses", {"model": "chant-call", "input": inp, "tools": tools}, run)
    observed(label, act)
    inp += a["output"] + [{"type": "function_call_output", "call_id": o["call_id"], "output": "found"} for o in a["output"] if o["type"] == "function_call"]
    a, _ = post("/v1/responses", {"model": "chant-call", "input": inp, "tools": tools}, run)
    check("%s, the next request (ends with a function_call_output)" % label, -1)
    return a, inp


# Responses, the whole input every time (the Agents SDK's way)
a, inp = whole_start("steer-resp", "responses")
at = len(inp) - 1
inp += a["output"] + [{"role": "user", "content": "Thanks. And the next one?"}]
post("/v1/responses", {"model": "chant-call", "input": inp, "tools": tools}, "steer-resp")
check("responses, a later request", at)

# Responses sent whole, then continued by previous_response_id: the note
# said with the whole input is in the response continued, so never again
# (until session 52 no test went from one way to the other)
a, inp = whole_start("steer-mixed", "whole, then previous_response_id")
for k in range(2):  # as many items as the whole input had, and more: the note's place is in none of them
    more = [{"role": "user", "content": "And then? %d.%d" % (k, j)} for j in range(len(inp) + 1)]
    a, _ = post("/v1/responses", {"model": "chant-call", "previous_response_id": a["id"], "input": more, "tools": tools}, "steer-mixed")
    check("whole, then previous_response_id (%d)" % k, None)

# Responses continued by previous_response_id: once
a, act = post("/v1/responses", {"model": "chant-call", "input": "Pay the invoice.", "tools": tools}, "steer-prev")
observed("previous_response_id", act)
fco = [{"type": "function_call_output", "call_id": o["call_id"], "output": "found"} for o in a["output"] if o["type"] == "function_call"]
a, _ = post("/v1/responses", {"model": "chant-call", "previous_response_id": a["id"], "input": fco, "tools": tools}, "steer-prev")
check("previous_response_id, the next request", -1)
for k in range(2):
    a, _ = post("/v1/responses", {"model": "chant-call", "previous_response_id": a["id"], "input": [{"role": "user", "content": "And then? %d" % k}], "tools": tools}, "steer-prev")
    check("previous_response_id, a later request (%d)" % k, None)

# Responses continued by previous_response_id, the request with the note
# refused by the upstream (busy: a 429): the note goes back to the run, and
# the client's retry of that request carries it (until session 51 no test
# sent this: the note kept for the retry was untested code)
a, act = post("/v1/responses", {"model": "chant-call", "input": "Pay the invoice.", "tools": tools}, "steer-retry")
observed("previous_response_id, refused", act)
fco = [{"type": "function_call_output", "call_id": o["call_id"], "output": "found"} for o in a["output"] if o["type"] == "function_call"]
status = 200
try:
    post("/v1/responses", {"model": "busy", "previous_response_id": a["id"], "input": fco, "tools": tools}, "steer-retry")
except urllib.error.HTTPError as e:
    status = e.code
if status != 429:
    bad.append("previous_response_id, refused: the busy upstream's request answered %s, not 429" % status)
check("previous_response_id, the request the upstream refused", -1)
a, _ = post("/v1/responses", {"model": "chant-call", "previous_response_id": a["id"], "input": fco, "tools": tools}, "steer-retry")
check("previous_response_id, the retry after the upstream's 429", -1)
post("/v1/responses", {"model": "chant-call", "previous_response_id": a["id"], "input": [{"role": "user", "content": "And then?"}], "tools": tools}, "steer-retry")
check("previous_response_id, after the retry", None)

# Responses continued from the gateway's own answer (a stream cut at the loop)
a, act = post("/v1/responses", {"model": "chant", "stream": True, "input": "Any news?"}, "steer-own", stream=True)
if not a["id"].startswith("resp_lg"):
    bad.append("own answer: the cut stream's answer is %s, not the gateway's own" % a["id"])
a, _ = post("/v1/responses", {"model": "plain", "previous_response_id": a["id"], "input": [{"role": "user", "content": "Something else, then."}]}, "steer-own")
check("own answer, the next request", -1)
post("/v1/responses", {"model": "plain", "previous_response_id": a["id"], "input": [{"role": "user", "content": "And then?"}]}, "steer-own")
check("own answer, a later request", None)

# Chat Completions and Messages: the whole conversation every time
ctools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
msgs = [{"role": "user", "content": "Pay the invoice."}]
a, act = post("/v1/chat/completions", {"model": "chant-call", "messages": msgs, "tools": ctools}, "steer-chat")
observed("chat", act)
m = a["choices"][0]["message"]
msgs += [m] + [{"role": "tool", "tool_call_id": c["id"], "content": "found"} for c in m["tool_calls"]]
a, _ = post("/v1/chat/completions", {"model": "chant-call", "messages": msgs, "tools": ctools}, "steer-chat")
check("chat, the next request", -1)
at = len(msgs) - 1
msgs += [a["choices"][0]["message"], {"role": "user", "content": "Thanks."}]
post("/v1/chat/completions", {"model": "chant-call", "messages": msgs, "tools": ctools}, "steer-chat")
check("chat, a later request", at)

mtools = [{"name": "lookup", "input_schema": {"type": "object"}}]
msgs = [{"role": "user", "content": "Pay the invoice."}]
a, act = post("/v1/messages", {"model": "chant-call", "max_tokens": 64, "messages": msgs, "tools": mtools}, "steer-msgs")
observed("messages", act)
msgs += [{"role": "assistant", "content": a["content"]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": "found"} for b in a["content"] if b["type"] == "tool_use"]}]
post("/v1/messages", {"model": "chant-call", "max_tokens": 64, "messages": msgs, "tools": mtools}, "steer-msgs")
check("messages, the next request", -1)

if bad:
    print("\n".join(bad))
    sys.exit(1)
