#!/usr/bin/env bash
# python_demo.sh — examples/python/demo.py against a real `loopguard serve`,
# checking what the demo and the README say it shows:
#   - turns 1 and 2 execute (the second with a steer message), 3 to 5 are
#     blocked with same_call_repeat and a message, the 6th stops the run;
#     the envelope says same_call_repeat, 2 steps, 3 blocked, and what may
#     happen next;
#   - the variants reach the wire as the model wrote them: the demo runs
#     through a recording proxy, whose log holds "amount": 4.9e1 and
#     "inv-1042 " (Python's json would have sent 49.0); replaying the run's
#     trace stops it the same way, as the demo's last line suggests;
#   - without the demo's loop_key policy, "inv-1042 " is another call: the
#     policy is what makes it the same invoice (the README shows it);
#   - the client takes https:// URLs (and a path prefix).
source "$(dirname "$0")/serve_lib.bash"
src=$LG_SOURCE_DIR
demo=$src/examples/python/demo.py

start_server demo --store memory:
# A recording proxy in front of the server: every request body, one a line.
python3 - "$demo_URL" "$TMP/wire.log" "$TMP/proxy.port" <<'PY' &
import http.client, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit
up = urlsplit(sys.argv[1]); log = open(sys.argv[2], "ab", buffering=0); lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def fwd(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with lock: log.write(self.command.encode() + b" " + self.path.encode() + b" " + body + b"\n")
        c = http.client.HTTPConnection(up.hostname, up.port, timeout=10)
        c.request(self.command, self.path, body=body or None, headers={"Content-Type": "application/json"})
        r = c.getresponse(); data = r.read()
        self.send_response(r.status)
        for k in ("Content-Type", "Retry-After"):
            if r.getheader(k): self.send_header(k, r.getheader(k))
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    do_GET = do_POST = do_PUT = fwd
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[3], "w").write(str(s.server_address[1]))
s.serve_forever()
PY
ALL_PIDS+=("$!")
for _ in $(seq 100); do [ -s "$TMP/proxy.port" ] && break; sleep 0.05; done
proxy_URL=http://127.0.0.1:$(cat "$TMP/proxy.port")
out=$(python3 "$demo" --url "$proxy_URL" 2>"$TMP/demo.err")
rc=$?
[ $rc = 0 ] || fail "demo.py exited $rc: $(cat "$TMP/demo.err") $out"
printf '%s\n' "$out" >"$TMP/demo.out"
python3 - "$TMP/demo.out" <<'PY' || fail "the demo did not show what it claims (above)"
import json, re, sys
text = open(sys.argv[1]).read()
bad = []
turns = re.split(r"\n(?=turn \d+ )", text)
guard = {}
for t in turns:
    m = re.match(r"turn (\d+) ", t)
    if m:
        g = re.search(r"guard: (.*)", t)
        guard[int(m.group(1))] = g.group(1) if g else ""
want = {1: "execute", 2: "execute, with a word for the model", 3: "BLOCK (same_call_repeat)",
        4: "BLOCK (same_call_repeat)", 5: "BLOCK (same_call_repeat)", 6: "STOP (same_call_repeat"}
for n, w in want.items():
    if not guard.get(n, "").startswith(w): bad.append("turn %d: guard said %r, wanted %r" % (n, guard.get(n), w))
if 7 in guard: bad.append("a 7th turn ran after the stop")
for n in (3, 4, 5):
    if "I will change the arguments" not in guard.get(n, ""): bad.append("turn %d: no message for the model" % n)
if "4.9e1" not in turns[3] if len(turns) > 3 else True: bad.append("turn 3 does not show the model's 4.9e1")
env = json.loads(text[text.index("Terminal envelope:") + len("Terminal envelope:"):text.index("\nreplay it:")])
for k, v in (("terminal_reason", "same_call_repeat"), ("guard", "repeat"), ("next_allowed_action", "resume_after_change")):
    if env.get(k) != v: bad.append("envelope %s = %r, wanted %r" % (k, env.get(k), v))
c = env.get("counters", {})
if (c.get("steps"), c.get("blocked"), c.get("calls")) != (2, 3, 6): bad.append("envelope counters %r" % c)
if env.get("refused_call", {}).get("key_material") != '{"amount":49,"invoice":"INV-1042"}':
    bad.append("refused_call key material %r" % env.get("refused_call"))
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY

note "the wire, and the trace"
run_id=$(grep -o '^run run_[0-9a-f]*' "$TMP/demo.out" | cut -d' ' -f2)
[ -n "$run_id" ] || fail "no run id in the demo's output"
grep -q '/calls {"tool":"charge_card","args":{"invoice": "inv-1042 ", "amount": 4.9e1}' "$TMP/wire.log" ||
  fail "4.9e1 did not reach the server as the model wrote it: $(grep /calls "$TMP/wire.log")"
grep -q '"args":{"invoice":"INV-1042","amount":49.00}' "$TMP/wire.log" || fail "49.00 did not reach the server as written"
curl -sf "$demo_URL/v1/runs/$run_id/trace" >"$TMP/run.jsonl" || fail "GET trace"
"$LG_BIN" replay --json "$TMP/run.jsonl" >"$TMP/replay.json" || fail "replaying the demo's trace"
tail -n 1 "$TMP/replay.json" | grep_q '"terminal_reason":"same_call_repeat"' ||
  fail "the replay does not stop as the server did: $(tail -n 1 "$TMP/replay.json")"

note "the default policy, and https"
PYTHONPATH=$src/examples/python python3 - "$demo_URL" <<'PY' || fail "the client checks"
import sys
from loopguard_client import Client, RawJSON
lg = Client(sys.argv[1])
variants = ['{"invoice": "INV-1042", "amount": 49}', '{"amount": 49.0, "invoice": "INV-1042"}',
            '{"invoice": "inv-1042 ", "amount": 4.9e1}']
run = lg.create_run()  # the default policy: every argument, as it is
acts = []
for turn, v in enumerate(variants, 1):
    d = lg.call(run["run_id"], "charge_card", v, turn=turn)
    acts.append(d["action"])
    if d["action"] == "execute":
        lg.result(run["run_id"], "retryable", call_id=d["call_id"])
# 49 and 49.0 are one call by value; "inv-1042 " is another invoice without a loop_key.
assert acts == ["execute", "execute", "execute"], acts
assert lg.call(run["run_id"], "charge_card", variants[0], turn=4)["action"] == "block"
# https:// and a path prefix are understood (no TLS server here: only parsed).
c = Client("https://guard.example:8443/lg/")
assert (c.https, c.host, c.port, c.prefix) == (True, "guard.example", 8443, "/lg"), vars(c)
assert Client("https://guard.example").port == 443
try:
    Client("ftp://x")
    raise SystemExit("ftp:// accepted")
except ValueError:
    pass
try:
    RawJSON("{not json")
    raise SystemExit("bad JSON accepted")
except ValueError:
    pass
print("-- client checks passed")
PY
stop_server demo
echo "python_demo.sh: passed"
