#!/usr/bin/env bash
# serve_budget.sh — the spend gate over HTTP where a signal is part of it:
# SIGHUP reloads --prices (a model without a price is 422 before, priced
# after), and a price file that no longer parses keeps the old prices.
# The budgets' requests and answers (PUT/GET, reserve and settle, the
# refusal of each scope kind, bad input, a run's scopes, the bound on a
# reported cost) are data: tests/data/http/budgets, budget-run-scopes
# (ctest http_cases). Also: a run purged and made again under its id settles
# its own reservations (the CLI purge between).
. "$(dirname "$0")/serve_lib.bash"

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

note "a run purged and made again under its id: its model call's usage settles the new reservation, not the old run's settled one"
r=$(req PUT /v1/budgets/team:again '{"limit_usd": 10, "period": "none"}'); expect "PUT team:again" 200 "$r"
for round in 1 2; do
  r=$(req POST /v1/runs '{"run_id": "again1", "scopes": ["team:again"]}'); expect "run again1 ($round)" 201 "$r"
  r=$(req POST /v1/runs/again1/model '{"model": "m1", "input_tokens": 10, "max_tokens": 10}')
  expect "model ($round)" 200 "$r"
  rsv=$(echo "${r#* }" | field 'd["reservation_id"]')
  r=$(req POST /v1/runs/again1/usage "{\"reservation_id\": \"$rsv\", \"input_tokens\": 10, \"output_tokens\": 10}")
  expect "usage ($round)" 200 "$r"
  if [ $round = 1 ]; then
    sleep 1.2
    "$LG_BIN" runs purge --older-than 1s --store "$(test_store_url budget)" >"$TMP/purge.out" 2>&1 ||
      fail "runs purge: $(cat "$TMP/purge.out")"
    [ "$(req GET /v1/runs/again1 | cut -d' ' -f1)" = 404 ] || fail "again1 was not purged: $(cat "$TMP/purge.out")"
  fi
done
r=$(req GET /v1/budgets/team:again)
[ "$(echo "${r#* }" | field '[round(d["spent_usd"] * 1e6), round(d["reserved_usd"] * 1e6)]')" = "[60, 0]" ] ||
  fail "the second run's usage did not settle its own reservation (10 in at 1 and 10 out at 2 USD per million, twice: 60 micro-USD spent, none reserved): $r"

stop_server B
echo "serve_budget: ok"
