#!/usr/bin/env bash
# serve_undo.sh — who may undo what over HTTP (docs/security.md), where a
# lease must run out: resolving an unknown_outcome key is an operator's act
# (the claimant's own token is 403, saying who may), GET
# /v1/operations/{key} shows who did it and when, and the key can be
# claimed again. The rest of who may undo what (claim tokens, the engine's
# own path, an agent's settlement bounded) is data:
# tests/data/http/operations-claim-tokens (ctest http_cases).
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

note "unknown_outcome is an operator's to resolve, and recorded"
r=$(req $AG POST /v1/operations/claim "{\"key\":\"refund-9\",\"request_fingerprint\":\"$FP\",\"lease_ms\":100}")
expect claim 201 "$r"
TOK2=$(echo "${r#* }" | field 'd["claim_token"]')
sleep 0.3
r=$(req $AG POST /v1/operations/refund-9/fail "{\"retryable\":true,\"claim_token\":\"$TOK2\"}")
expect "the claimant frees an unknown outcome" 403 "$r"
echo "${r#* }" | grep_q 'only an operator' || fail "403 without who may: $r"
r=$(req $OP POST /v1/operations/refund-9/fail '{"retryable":true}'); expect "operator frees it" 200 "$r"
r=$(req $AG GET /v1/operations/refund-9); expect "get freed" 200 "$r"
[ "$(echo "${r#* }" | field 'd["state"]')" = free ] || fail "not free: $r"
[ "$(echo "${r#* }" | field 'd["resolved_by"]')" = http:operator ] || fail "no resolved_by: $r"
[ "$(echo "${r#* }" | field 'd["resolved_at"] is not None')" = true ] || fail "no resolved_at: $r"
r=$(req $AG POST /v1/operations/claim "{\"key\":\"refund-9\",\"request_fingerprint\":\"$FP\"}")
expect "claimed again after the operator freed it" 201 "$r"

stop_server A
echo "serve_undo: all passed"
