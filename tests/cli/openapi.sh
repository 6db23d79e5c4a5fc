#!/usr/bin/env bash
# openapi.sh — docs/openapi.json against the server that really runs:
#   - GET /openapi.json (open, like /healthz) serves docs/openapi.json byte
#     for byte: the document is compiled in, and it is this one;
#   - it is an OpenAPI 3.1 document (checked with openapi-spec-validator
#     when Python has it; a structural check always);
#   - every route of the server's own route table (LG__ROUTE_MAP in
#     src/server/server.h, which names every route the router can reach and
#     labels its metrics) has an operation in the document
#     (x-loopguard-route), and the document names no route the table lacks:
#     a route added to the server without the document fails here;
#   - every path and method of the document answers something other than
#     404 or 405 on a running server (with a run, an operation and a
#     budget to name), and the x-loopguard-role of each holds when tokens
#     are configured: "none" answers with no token, the others are 401.
source "$(dirname "$0")/serve_lib.bash"
src=$LG_SOURCE_DIR

note "GET /openapi.json"
start_server api --store memory:
curl -sS -o "$TMP/served.json" -w '%{http_code} %{content_type}\n' "$api_URL/openapi.json" >"$TMP/code" ||
  fail "GET /openapi.json: curl failed"
read -r code ctype <"$TMP/code"
[ "$code" = 200 ] || fail "GET /openapi.json: $code"
[ "$ctype" = application/json ] || fail "GET /openapi.json: Content-Type $ctype"
cmp -s "$TMP/served.json" "$src/docs/openapi.json" || fail "the served document is not docs/openapi.json (rebuild?)"

note "an OpenAPI 3.1 document, and the route table"
python3 - "$src/docs/openapi.json" "$src/src/server/server.h" <<'PY' || fail "the document and the route table disagree"
import json, re, sys
doc = json.load(open(sys.argv[1]))
bad = []
if not str(doc.get("openapi", "")).startswith("3.1."): bad.append("openapi is not 3.1.x")
try:
    from openapi_spec_validator import validate
    validate(doc)
    print("-- openapi-spec-validator: valid")
except ImportError:
    print("-- openapi-spec-validator not installed: structural checks only")
except Exception as e:  # the validator's own error
    bad.append("openapi-spec-validator: %s" % str(e).splitlines()[0])
hdr = open(sys.argv[2]).read()
m = re.search(r"#define LG__ROUTE_MAP\(XX\)(.*?)\n\n", hdr, re.S)
# (not the API's: "other", what no route took; "gateway", the model APIs the
# gateway speaks, whose reference is docs/gateway.md and gateway-v1)
table = set(re.findall(r'XX\(\s*\w+\s*,\s*"([a-z_]+)"\s*\)', m.group(1))) - {"other", "gateway"}
if len(table) < 10: bad.append("could not read LG__ROUTE_MAP (%d routes)" % len(table))
documented = set()
for path, item in doc["paths"].items():
    for meth, op in item.items():
        if meth == "parameters": continue
        r = op.get("x-loopguard-route")
        if not r: bad.append("%s %s: no x-loopguard-route" % (meth.upper(), path)); continue
        documented.add(r)
        if not op.get("responses"): bad.append("%s %s: no responses" % (meth.upper(), path))
        if op.get("x-loopguard-role") not in ("none", "agent", "operator", "key"):
            bad.append("%s %s: x-loopguard-role" % (meth.upper(), path))
        for code, resp in op["responses"].items():
            if not resp.get("description"): bad.append("%s %s %s: no description" % (meth.upper(), path, code))
for r in sorted(table - documented): bad.append("route %r of the server's table is not in docs/openapi.json" % r)
for r in sorted(documented - table): bad.append("docs/openapi.json names route %r that the server's table lacks" % r)
for b in bad: print("FAIL:", b)
print("-- %d routes in the table, %d documented" % (len(table), len(documented)))
sys.exit(1 if bad else 0)
PY

note "every documented path and method is answered"
# Things for the paths to name.
curl -s -XPOST "$api_URL/v1/runs" -H 'Content-Type: application/json' -d '{"run_id":"r1","group":"g1"}' >/dev/null
curl -s -XPOST "$api_URL/v1/operations/claim" -H 'Content-Type: application/json' -d '{"key":"k1","request_fingerprint":"fp"}' >/dev/null
curl -s -XPUT "$api_URL/v1/budgets/key:alice" -H 'Content-Type: application/json' -d '{"limit_usd":1,"period":"daily"}' >/dev/null
KEY_HASH=$(curl -s -XPOST "$api_URL/v1/keys" -H 'Content-Type: application/json' -d '{"name":"probe"}' | jq_py 'd["hash"]')
export KEY_HASH
probe() { # URL TOKEN_OR_EMPTY -> lines "METHOD PATH ROLE CODE"
  python3 - "$src/docs/openapi.json" "$1" "$2" <<'PY'
import json, os, sys, urllib.request, urllib.error
doc = json.load(open(sys.argv[1])); base = sys.argv[2]; token = sys.argv[3]
names = {"id": "r1", "group": "g1", "key": "k1", "scope": "key:alice", "hash": os.environ.get("KEY_HASH", "h")}
for path, item in doc["paths"].items():
    for meth, op in item.items():
        if meth == "parameters": continue
        url = base + path
        for k, v in names.items(): url = url.replace("{%s}" % k, v)
        data = b"{}" if meth in ("post", "put") else None
        rq = urllib.request.Request(url, data=data, method=meth.upper())
        if token: rq.add_header("Authorization", "Bearer " + token)
        if data is not None: rq.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(rq, timeout=10) as r: code = r.status
        except urllib.error.HTTPError as e: code = e.code
        print(meth.upper(), path, op.get("x-loopguard-role"), code)
PY
}
probe "$api_URL" "" >"$TMP/open.txt" || fail "probing failed"
n=$(wc -l <"$TMP/open.txt")
[ "$n" -ge 20 ] || fail "only $n operations probed"
if grep -E ' (404|405)$' "$TMP/open.txt"; then fail "documented operations the server does not have (above)"; fi
note "$n operations answered"

note "GET /v1/budgets lists the budgets"
curl -s -XPUT "$api_URL/v1/budgets/workspace:acme" -H 'Content-Type: application/json' -d '{"limit_usd":2.5,"period":"monthly"}' >/dev/null
got=$(curl -s "$api_URL/v1/budgets" | jq_py '[(b["scope"], b["limit_usd"], b["period"]) for b in d["budgets"] if b["scope"] != "key:'"$KEY_HASH"'"]')
[ "$got" = '[["key:alice", 1, "daily"], ["workspace:acme", 2.5, "monthly"]]' ] || fail "GET /v1/budgets: $got"
stop_server api
start_server empty --store memory:
got=$(curl -s -w ' %{http_code}' "$empty_URL/v1/budgets")
[ "$got" = '{"budgets":[]} 200' ] || fail "GET /v1/budgets with none: $got"
got=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$empty_URL/v1/budgets")
[ "$got" = 405 ] || fail "POST /v1/budgets: $got, not 405"
stop_server empty

note "roles, with tokens"
printf 'agent tok-agent-0123456789abcdef\noperator tok-operator-0123456789abcdef\n' >"$TMP/tokens"
start_server auth --store memory: --tokens "$TMP/tokens"
curl -s -H 'Authorization: Bearer tok-operator-0123456789abcdef' -XPOST "$auth_URL/v1/runs" -H 'Content-Type: application/json' -d '{"run_id":"r1","group":"g1"}' >/dev/null
probe "$auth_URL" "" >"$TMP/anon.txt" || fail "probing failed"
while read -r meth path role code; do
  if [ "$role" = none ]; then
    [ "$code" != 401 ] || fail "$meth $path is documented as open but wants a token"
  else
    [ "$code" = 401 ] || fail "$meth $path ($role) answered $code with no token"
  fi
done <"$TMP/anon.txt"
probe "$auth_URL" tok-agent-0123456789abcdef >"$TMP/agent.txt" || fail "probing failed"
while read -r meth path role code; do
  if [ "$role" = operator ]; then
    [ "$code" = 403 ] || fail "$meth $path (operator) answered $code to an agent token"
  elif [ "$role" = key ]; then # the loopguard key itself, not a token
    [ "$code" = 401 ] || fail "$meth $path (key) answered $code to an agent token"
  else
    [ "$code" != 403 ] && [ "$code" != 401 ] || fail "$meth $path ($role) answered $code to an agent token"
  fi
done <"$TMP/agent.txt"
stop_server auth
echo "openapi.sh: passed"
