#!/usr/bin/env bash
# serve_budget.sh — the spend gate over HTTP (http-api-v1, "Budgets"):
# PUT/GET a budget, reserve and settle, the refusal of each scope kind
# with its status and metadata (key: 402, workspace: 403, other 402,
# max_in_flight 429 with Retry-After), bad input, roles; and a run that
# names its scopes: its model calls reserve against them and the one that
# does not fit stops the run with budget_exceeded before it is made.
. "$(dirname "$0")/serve_lib.bash"

start_server A --store "$(test_store_url budget)"
U=$A_URL
req() { # METHOD PATH [BODY] -> "CODE BODY"
  local out code
  out=$(curl -s -w '\n%{http_code}' -X "$1" "$U$2" ${3:+-H "Content-Type: application/json" -d "$3"})
  code=${out##*$'\n'}
  printf '%s %s' "$code" "${out%$'\n'*}"
}
expect() { # WHAT WANT_CODE "CODE BODY"
  [ "${3%% *}" = "$2" ] || fail "$1: HTTP ${3%% *}, wanted $2: ${3#* }"
}
field() { jq_py "$1"; } # over stdin

note "set and read budgets"
r=$(req PUT /v1/budgets/key:alice '{"limit_usd": 0.05, "period": "daily"}'); expect "PUT key" 200 "$r"
[ "$(echo "${r#* }" | field 'd["remaining_usd"]')" = 0.05 ] || fail "remaining: ${r#* }"
r=$(req GET /v1/budgets/key:alice); expect "GET key" 200 "$r"
[ "$(echo "${r#* }" | field 'd["period"]')" = daily ] || fail "period: ${r#* }"
r=$(req PUT /v1/budgets/workspace:acme '{"limit_usd": 0.02, "period": "monthly"}'); expect "PUT ws" 200 "$r"
r=$(req PUT /v1/budgets/team:ops '{"limit_usd": 0.02, "period": "weekly", "max_in_flight_usd": 0.015}')
expect "PUT team" 200 "$r"
r=$(req GET /v1/budgets/key:nobody); expect "unknown scope" 404 "$r"

note "bad input: clear errors naming the field"
r=$(req PUT /v1/budgets/key:x '{"limit_usd": -1, "period": "daily"}'); expect "negative limit" 400 "$r"
r=$(req PUT /v1/budgets/key:x '{"limit_usd": 1, "period": "hourly"}'); expect "bad period" 400 "$r"
echo "${r#* }" | grep -q period || fail "bad period names no field: $r"
r=$(req PUT /v1/budgets/key:x '{"limit_usd": 1, "period": "daily", "limt": 2}'); expect "unknown field" 400 "$r"
r=$(req POST /v1/budgets/reserve '{"scopes": [], "amount_usd": 1}'); expect "no scopes" 400 "$r"
r=$(req POST /v1/budgets/reserve '{"scopes": ["key:alice"], "amount_usd": -0.1}'); expect "negative amount" 400 "$r"
r=$(req POST /v1/budgets/reserve '{"scopes": ["key:nobody"], "amount_usd": 0.01}'); expect "reserve unknown scope" 404 "$r"
r=$(req POST /v1/budgets/settle '{"reservation_id": "rsv_nope", "actual_usd": 0.01}'); expect "settle unknown" 404 "$r"
r=$(req DELETE /v1/budgets/key:alice); expect "DELETE" 405 "$r"

note "reserve and settle; the refusal of a key: scope is 402 key_limit"
r=$(req POST /v1/budgets/reserve '{"scopes": ["key:alice"], "amount_usd": 0.03}'); expect "reserve" 201 "$r"
id=$(echo "${r#* }" | field 'd["reservation_id"]')
r=$(req POST /v1/budgets/reserve '{"scopes": ["key:alice"], "amount_usd": 0.03}'); expect "over key" 402 "$r"
[ "$(echo "${r#* }" | field 'd["error"]["metadata"]["limit_source"]')" = key_limit ] || fail "limit_source: $r"
[ "$(echo "${r#* }" | field 'd["error"]["metadata"]["requested_usd"]')" = 0.03 ] || fail "requested_usd: $r"
r=$(req POST /v1/budgets/settle "{\"reservation_id\": \"$id\", \"actual_usd\": 0.012}"); expect "settle" 200 "$r"
r=$(req POST /v1/budgets/settle "{\"reservation_id\": \"$id\", \"actual_usd\": 0.012}"); expect "settle twice" 409 "$r"
r=$(req GET /v1/budgets/key:alice)
[ "$(echo "${r#* }" | field 'd["spent_usd"]')" = 0.012 ] || fail "spent after settle: $r"
[ "$(echo "${r#* }" | field 'd["reserved_usd"]')" = 0 ] || fail "reserved after settle: $r"

note "all or none: a reservation over two scopes refused by one holds on neither"
r=$(req POST /v1/budgets/reserve '{"scopes": ["key:alice", "workspace:acme"], "amount_usd": 0.03}')
expect "over workspace" 403 "$r"
[ "$(echo "${r#* }" | field 'd["error"]["metadata"]["limit_source"]')" = workspace_budget ] || fail "$r"
r=$(req GET /v1/budgets/key:alice)
[ "$(echo "${r#* }" | field 'd["reserved_usd"]')" = 0 ] || fail "key:alice holds after a refusal: $r"

note "any other scope: 402 scope_budget; in flight: 429 with Retry-After"
r=$(req POST /v1/budgets/reserve '{"scopes": ["team:ops"], "amount_usd": 0.01}'); expect "team first" 201 "$r"
hdr=$(curl -s -i -X POST "$U/v1/budgets/reserve" -H 'Content-Type: application/json' -d '{"scopes": ["team:ops"], "amount_usd": 0.01}')
head -n 1 <<<"$hdr" | grep -q " 429 " || fail "in flight: $(head -n 1 <<<"$hdr")"
grep -qi "^Retry-After: [1-9]" <<<"$hdr" || fail "no Retry-After: $hdr"
grep -q in_flight_budget <<<"$hdr" || fail "no in_flight_budget: $hdr"
r=$(req POST /v1/budgets/reserve '{"scopes": ["team:ops"], "amount_usd": 0.012}'); expect "over team" 402 "$r"
[ "$(echo "${r#* }" | field 'd["error"]["metadata"]["limit_source"]')" = scope_budget ] || fail "$r"

note "a run with scopes: the model call that does not fit stops the run before it is made"
req PUT /v1/budgets/customer:c1 '{"limit_usd": 0.05, "period": "none"}' >/dev/null
r=$(req POST /v1/runs '{"run_id": "b1", "scopes": ["customer:nope"]}'); expect "run, unknown scope" 404 "$r"
r=$(req POST /v1/runs '{"run_id": "b1", "scopes": ["customer:c1"]}'); expect "run" 201 "$r"
r=$(req POST /v1/runs/b1/model '{"input_tokens": 100, "max_tokens": 100, "cost_usd": 0.03}'); expect "model 1" 200 "$r"
[ "$(echo "${r#* }" | field 'd["action"]')" = execute ] || fail "model 1: $r"
rid=$(echo "${r#* }" | field 'd["reservation_id"]')
r=$(req POST /v1/runs/b1/usage "{\"reservation_id\": \"$rid\", \"input_tokens\": 100, \"output_tokens\": 80, \"cost_usd\": 0.025}")
expect "usage" 200 "$r"
r=$(req GET /v1/budgets/customer:c1)
[ "$(echo "${r#* }" | field 'd["spent_usd"]')" = 0.025 ] || fail "usage not settled in the budget: $r"
r=$(req POST /v1/runs/b1/model '{"input_tokens": 100, "max_tokens": 100, "cost_usd": 0.03}'); expect "model 2" 200 "$r"
[ "$(echo "${r#* }" | field 'd["action"]')" = stop ] || fail "model 2 not stopped: $r"
[ "$(echo "${r#* }" | field 'd["reason"]')" = budget_exceeded ] || fail "reason: $r"
[ "$(echo "${r#* }" | field 'd["metadata"]["scope"]')" = customer:c1 ] || fail "metadata: $r"
r=$(req GET /v1/budgets/customer:c1)
[ "$(echo "${r#* }" | field 'd["spent_usd"] + d["reserved_usd"] <= d["limit_usd"]')" = true ] || fail "overshot: $r"

note "metrics count the refusals"
# (read it whole first: grep -q would close the pipe early, and pipefail
# would count curl's broken pipe as a failure)
metrics=$(curl -s "$U/metrics")
grep -q 'loopguard_budget_refusals_total{limit_source="key_limit"} [1-9]' <<<"$metrics" ||
  fail "no key_limit refusal in /metrics"
stop_server A
[ "$A_RC" = 0 ] || fail "server exit $A_RC"

note "SIGHUP reloads --prices; a price file that no longer parses keeps the old prices"
P=$TMP/prices.json
echo '{"version": 1, "models": {"m1": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}}}' >"$P"
start_server B --store "$(test_store_url budget)" --prices "$P" --log "$TMP/B.log"
U=$B_URL
hup_and_wait() { # EVENT: SIGHUP, then wait for EVENT in the log
  local before i
  before=$(grep -c "\"$1\"" "$TMP/B.log")
  kill -HUP "$B_PID"
  for i in $(seq 100); do
    [ "$(grep -c "\"$1\"" "$TMP/B.log")" -gt "$before" ] && return 0
    sleep 0.05
  done
  fail "no $1 in the log after SIGHUP: $(tail -n 3 "$TMP/B.log")"
}
r=$(req PUT /v1/budgets/customer:c2 '{"limit_usd": 10, "period": "none"}'); expect "PUT c2" 200 "$r"
r=$(req POST /v1/runs '{"run_id": "p1", "scopes": ["customer:c2"]}'); expect "run p1" 201 "$r"
r=$(req POST /v1/runs/p1/model '{"model": "m2", "input_tokens": 10, "max_tokens": 10}')
expect "m2 has no price yet" 422 "$r"
echo '{"version": 1, "models": {"m1": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2},
  "m2": {"input_usd_per_mtok": 3, "output_usd_per_mtok": 4}}}' >"$P"
hup_and_wait prices_reloaded
r=$(req POST /v1/runs/p1/model '{"model": "m2", "input_tokens": 10, "max_tokens": 10}')
expect "m2 priced after SIGHUP" 200 "$r"
[ "$(echo "${r#* }" | field 'd["action"]')" = execute ] || fail "m2 after SIGHUP: $r"
echo '{"version": 1, "models": {"m2": {"input_usd_per_mtok": -3}}}' >"$P"
hup_and_wait prices_not_reloaded
r=$(req POST /v1/runs/p1/model '{"model": "m2", "input_tokens": 10, "max_tokens": 10}')
expect "old prices kept after a bad file" 200 "$r"

note "a usage's reported cost settles a shared budget at most at its reservation"
r=$(req PUT /v1/budgets/team:bound '{"limit_usd": 1, "period": "none"}'); expect "PUT bound" 200 "$r"
r=$(req POST /v1/runs '{"run_id": "bound1", "scopes": ["team:bound"]}'); expect "bound run" 201 "$r"
r=$(req POST /v1/runs/bound1/model '{"input_tokens": 10, "max_tokens": 10, "cost_usd": 0.01}')
expect "bound model" 200 "$r"
rid=$(echo "${r#* }" | field 'd["reservation_id"]')
r=$(req POST /v1/runs/bound1/usage "{\"reservation_id\": \"$rid\", \"input_tokens\": 10, \"output_tokens\": 10, \"cost_usd\": 999999}")
expect "bound usage" 200 "$r"
r=$(req GET /v1/budgets/team:bound); expect "GET bound" 200 "$r"
[ "$(echo "${r#* }" | field 'd["spent_usd"]')" = 0.01 ] || fail "a reported cost of 999999 USD was charged: ${r#* }"
stop_server B
[ "$B_RC" = 0 ] || fail "server B exit $B_RC"
echo "serve_budget: ok"
