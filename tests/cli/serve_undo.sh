#!/usr/bin/env bash
# serve_undo.sh — who may undo what over HTTP (docs/security.md): an agent
# token commits or fails a key only with the claim_token its claim
# returned (403 forbidden otherwise, saying who may), resolving an
# unknown_outcome key is an operator's act and GET /v1/operations/{key}
# shows who did it and when, the engine's own path (/calls claims,
# /results settles) needs no token, and an agent's settlement above its
# reservation is bounded and says so.
. "$(dirname "$0")/serve_lib.bash"

AG=agent-token-0123456789abcdef
OP=operator-token-0123456789abcdef
printf 'agent %s\noperator %s\n' "$AG" "$OP" >"$TMP/tokens"
start_server A --store "$(test_store_url undo)" --tokens "$TMP/tokens"
U=$A_URL
req() { # TOKEN METHOD PATH [BODY] -> "CODE BODY"
  local out code
  out=$(curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' -H "Authorization: Bearer $1" -X "$2" "$U$3" ${4:+-d "$4"})
  code=${out##*$'\n'}
  printf '%s %s' "$code" "${out%$'\n'*}"
}
expect() { # WHAT WANT_CODE "CODE BODY"
  [ "${3%% *}" = "$2" ] || fail "$1: HTTP ${3%% *}, wanted $2: ${3#* }"
}
field() { jq_py "$1"; }
FP=1111111111111111111111111111111111111111111111111111111111111111

note "a claim returns its claim_token"
r=$(req $AG POST /v1/operations/claim "{\"key\":\"charge-7\",\"request_fingerprint\":\"$FP\",\"run_id\":\"night-1\"}")
expect claim 201 "$r"
TOK=$(echo "${r#* }" | field 'd["claim_token"]')
[[ $TOK == ct_* ]] || fail "no claim_token: $r"

note "another agent cannot free or commit the key another run holds"
r=$(req $AG POST /v1/operations/charge-7/fail '{"retryable":true}'); expect "fail without token" 403 "$r"
echo "${r#* }" | grep -q '"forbidden"' || fail "not forbidden: $r"
echo "${r#* }" | grep -q 'only that claimant' || fail "the 403 does not say who may: $r"
r=$(req $AG POST /v1/operations/charge-7/fail '{"retryable":true,"claim_token":"ct_00000000000000000000000000000000"}')
expect "fail with a wrong token" 403 "$r"
r=$(req $AG POST /v1/operations/charge-7/commit '{"result":{"x":1}}'); expect "commit without token" 403 "$r"
r=$(req $AG POST /v1/operations/claim "{\"key\":\"charge-7\",\"request_fingerprint\":\"$FP\"}")
expect "still held" 409 "$r"
echo "${r#* }" | grep -q in_progress || fail "not in_progress: $r"

note "the claimant commits with its token"
r=$(req $AG POST /v1/operations/charge-7/commit "{\"result\":{\"receipt\":\"R-1\"},\"claim_token\":\"$TOK\"}")
expect "commit with token" 200 "$r"
r=$(req $AG GET /v1/operations/charge-7); expect get 200 "$r"
echo "${r#* }" | grep -q ct_ && fail "GET shows the claim token: $r"
[ "$(echo "${r#* }" | field 'd["resolved_by"]')" = null ] || fail "claimant's commit recorded as an operator's: $r"

note "unknown_outcome is an operator's to resolve, and recorded"
r=$(req $AG POST /v1/operations/claim "{\"key\":\"refund-9\",\"request_fingerprint\":\"$FP\",\"lease_ms\":100}")
expect claim 201 "$r"
TOK2=$(echo "${r#* }" | field 'd["claim_token"]')
sleep 0.3
r=$(req $AG POST /v1/operations/refund-9/fail "{\"retryable\":true,\"claim_token\":\"$TOK2\"}")
expect "the claimant frees an unknown outcome" 403 "$r"
echo "${r#* }" | grep -q 'only an operator' || fail "403 without who may: $r"
r=$(req $OP POST /v1/operations/refund-9/fail '{"retryable":true}'); expect "operator frees it" 200 "$r"
r=$(req $AG GET /v1/operations/refund-9); expect "get freed" 200 "$r"
[ "$(echo "${r#* }" | field 'd["state"]')" = free ] || fail "not free: $r"
[ "$(echo "${r#* }" | field 'd["resolved_by"]')" = http:operator ] || fail "no resolved_by: $r"
[ "$(echo "${r#* }" | field 'd["resolved_at"] is not None')" = true ] || fail "no resolved_at: $r"
r=$(req $AG POST /v1/operations/claim "{\"key\":\"refund-9\",\"request_fingerprint\":\"$FP\"}")
expect "claimed again after the operator freed it" 201 "$r"

note "the engine's own path claims and settles without a token"
r=$(req $AG POST /v1/runs '{"run_id":"eng-1","policy":{"tools":{"charge":{"side_effects":true}}}}')
expect "create run" 201 "$r"
r=$(req $AG POST /v1/runs/eng-1/calls '{"tool":"charge","args":{"invoice":7}}'); expect call 200 "$r"
[ "$(echo "${r#* }" | field 'd["action"]')" = execute ] || fail "not execute: $r"
KEY=$(echo "${r#* }" | field 'd["idempotency_key"]')
[ ${#KEY} -eq 67 ] || fail "derived key of length ${#KEY}: $KEY"
r=$(req $AG POST /v1/runs/eng-1/results '{"status":"progress","value":{"charged":7}}'); expect result 200 "$r"
r=$(req $AG GET "/v1/operations/$KEY"); expect "engine's key" 200 "$r"
[ "$(echo "${r#* }" | field 'd["state"]')" = committed ] || fail "engine did not commit its key: $r"

note "an agent's settlement above its reservation is bounded"
r=$(req $OP PUT /v1/budgets/key:shared '{"limit_usd": 10, "period": "daily"}'); expect "PUT budget" 200 "$r"
r=$(req $AG POST /v1/budgets/reserve '{"scopes":["key:shared"],"amount_usd":1}'); expect reserve 201 "$r"
RID=$(echo "${r#* }" | field 'd["reservation_id"]')
r=$(req $AG POST /v1/budgets/settle "{\"reservation_id\":\"$RID\",\"actual_usd\":999999999}")
expect "agent settles 1e9" 200 "$r"
[ "$(echo "${r#* }" | field 'd["capped"]')" = true ] || fail "not capped: $r"
[ "$(echo "${r#* }" | field 'd["actual_usd"]')" = 1 ] || fail "charged: $r"
r=$(req $AG GET /v1/budgets/key:shared); expect "GET budget" 200 "$r"
[ "$(echo "${r#* }" | field 'd["spent_usd"]')" = 1 ] || fail "spent: $r"
r=$(req $AG POST /v1/budgets/reserve '{"scopes":["key:shared"],"amount_usd":1}'); expect "the budget still serves others" 201 "$r"
RID=$(echo "${r#* }" | field 'd["reservation_id"]')
r=$(req $OP POST /v1/budgets/settle "{\"reservation_id\":\"$RID\",\"actual_usd\":2}")
expect "operator settles above" 200 "$r"
[ "$(echo "${r#* }" | field 'd["capped"]')" = false ] || fail "operator capped: $r"
[ "$(echo "${r#* }" | field 'd["actual_usd"]')" = 2 ] || fail "operator charged: $r"

stop_server A
[ "$A_RC" = 0 ] || fail "server exit $A_RC"
echo "serve_undo: all passed"
