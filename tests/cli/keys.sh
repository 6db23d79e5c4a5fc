#!/usr/bin/env bash
# keys.sh — `loopguard keys create|list|show|update|disable|rotate` as an
# operator calls it: the secret printed once and never again (list, show),
# --json as the HTTP routes answer, the budget key:ID the key's limit rides
# on (`loopguard budget show`), --help of every subcommand, errors that
# name what and where, exit codes 0/1/2; and a change made by the CLI is
# seen at once by a running server on the same store (a key disabled or
# rotated by the CLI is refused by the server's GET /v1/key right away).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/serve_lib.bash"
export LOOPGUARD_STORE="sqlite:$TMP/keys.db"
B=$LG_BIN
get() { jq_py "$1"; }

note "create: the secret once, the key's fields, its budget"
out=$("$B" keys create nightly --limit-usd 2.5 --reset daily --workspace acme --models a,b \
  --byok default=sk-provider --rate-limit 30 --json) || fail "create: $out"
K=$(echo "$out" | get 'd["key"]')
H=$(echo "$out" | get 'd["hash"]')
[[ $K == lgk-* ]] && [ ${#K} -ge 36 ] || fail "the secret: $out"
[ "$(echo "$out" | get '[d["limit_usd"], d["limit_reset"], d["workspace"], d["models"], d["byok_upstreams"], d["rate_limit_per_min"]]')" = '[2.5, "daily", "acme", ["a", "b"], ["default"], 30]' ] || fail "create: $out"
echo "$out" | grep >/dev/null sk-provider && fail "the provider key printed: $out"
human=$("$B" keys create other) || fail "create (human)"
echo "$human" | grep >/dev/null '^secret lgk-' || fail "the human create prints the secret: $human"
b=$("$B" budget show "key:$H" --json) || fail "budget show key:$H"
[ "$(echo "$b" | get '[d["limit_usd"], d["period"]]')" = '[2.5, "daily"]' ] || fail "the key's budget: $b"

note "list and show never print a secret"
l=$("$B" keys list --json) || fail "list"
[ "$(echo "$l" | get 'len(d["keys"])')" = 2 ] || fail "list: $l"
echo "$l" | grep >/dev/null 'lgk-' && fail "list prints a secret: $l"
s=$("$B" keys show "$H" --json) || fail "show"
[ "$(echo "$s" | get '[d["usage_daily_usd"], d["usage_weekly_usd"], d["usage_monthly_usd"], d["limit_remaining_usd"]]')" = '[0, 0, 0, 2.5]' ] || fail "show: $s"
echo "$s" | grep >/dev/null 'lgk-' && fail "show prints a secret"
"$B" keys show "$H" | grep_q 'today / week / month' || fail "show (human)"

note "the text form reads the answer as JSON: unset fields said so, strings whole"
T="sqlite:$TMP/text.db"
t=$("$B" keys create plain --store "$T") || fail "create plain: $t"
echo "$t" | grep_q null && fail "a key with no limit prints null: $t"
echo "$t" | grep_q '^  limit          no limit' && echo "$t" | grep_q '^  workspace      none$' &&
  echo "$t" | grep_q '^  models         any$' || fail "a key with no limit, text: $t"
echo "$t" | grep_q 'USD left' && fail "a key with no limit has USD left: $t"
t=$("$B" keys create 'w"q' --workspace 'w"q\x' --limit-usd 0.000125 --models a,b --store "$T") || fail "create w\"q: $t"
echo "$t" | grep_q '  w"q$' && echo "$t" | grep_q '^  workspace      w"q\\x$' || fail "a name and a workspace with a quote: $t"
echo "$t" | grep_q '^  limit          0.000125 USD, reset never$' && echo "$t" | grep_q '0.000125 USD left' &&
  echo "$t" | grep_q '^  models         a, b$' || fail "a limit of 0.000125 USD, text: $t"
h=$(echo "$t" | sed -n 's/^\([0-9a-f]\{64\}\)  .*/\1/p')
t=$("$B" keys show "$h" --store "$T") || fail "show (text): $t"
echo "$t" | grep_q '^  workspace      w"q\\x$' && echo "$t" | grep_q '^  today / week / month  0 / 0 / 0 USD$' || fail "show (text): $t"
t=$("$B" keys rotate "$h" --store "$T") || fail "rotate (text): $t"
echo "$t" | grep_q '^secret lgk-' && echo "$t" | grep_q '^  workspace      w"q\\x$' || fail "rotate (text): $t"

note "update keeps what is not given; none clears"
u=$("$B" keys update "$H" --limit-usd 4 --models none --json) || fail "update"
[ "$(echo "$u" | get '[d["limit_usd"], d["models"], d["workspace"], d["limit_reset"]]')" = '[4, null, "acme", "daily"]' ] || fail "update: $u"
[ "$("$B" budget show "key:$H" --json | get 'd["limit_usd"]')" = 4 ] || fail "the budget follows the limit"

note "a running server on the same store sees the CLI's changes at once"
start_server srv --store "$LOOPGUARD_STORE" --log "$TMP/srv.log"
self() { curl -s -o "$TMP/self" -w '%{http_code}' -H "Authorization: Bearer $1" "$srv_URL/v1/key"; }
[ "$(self "$K")" = 200 ] || fail "GET /v1/key: $(cat "$TMP/self")"
r=$("$B" keys rotate "$H" --json) || fail "rotate"
K2=$(echo "$r" | get 'd["key"]')
H2=$(echo "$r" | get 'd["hash"]')
[ "$H2" != "$H" ] && [ "$(echo "$r" | get 'd["id"]')" = "$H" ] || fail "rotate: $r"
[ "$(self "$K")" = 401 ] || fail "the old secret after a rotation by the CLI: $(cat "$TMP/self")"
[ "$(self "$K2")" = 200 ] || fail "the new secret: $(cat "$TMP/self")"
"$B" keys disable "$H2" >/dev/null || fail "disable"
[ "$(self "$K2")" = 401 ] && grep -q disabled "$TMP/self" || fail "disabled by the CLI: $(cat "$TMP/self")"
"$B" keys update "$H2" --enable >/dev/null || fail "enable"
[ "$(self "$K2")" = 200 ] || fail "enabled again: $(cat "$TMP/self")"
stop_server srv

note "--secret-file: the provider key stored encrypted (no clear copy in the store file)"
python3 -c 'import os; print(os.urandom(32).hex())' >"$TMP/secret"
e=$("$B" keys create sealed --byok default=sk-sealed-provider-0001 --secret-file "$TMP/secret" --json) || fail "create --secret-file: $e"
[ "$(echo "$e" | get 'd["byok_at_rest"]')" = encrypted ] || fail "create --secret-file: $e"
[ "$("$B" keys show "$H" --json | get 'd["byok_at_rest"]')" = clear ] || fail "the key made without a secret is not said to be in clear"
grep -qa sk-sealed-provider "$TMP"/keys.db* && fail "the store file holds the sealed provider key in clear"
grep -qa sk-provider "$TMP"/keys.db* || fail "the check cannot see the store: the clear provider key is not found either"
LOOPGUARD_SECRET_FILE="$TMP/secret" "$B" keys update "$H" --limit-usd 4 --json | grep_q '"byok_at_rest":"encrypted"' ||
  fail "an update with LOOPGUARD_SECRET_FILE does not seal the clear provider key"
echo short >"$TMP/bad-secret"
"$B" keys create x --byok default=sk-x --secret-file "$TMP/bad-secret" 2>"$TMP/err"; [ $? = 1 ] &&
  grep -q "bad-secret" "$TMP/err" && grep -q "64 hex digits" "$TMP/err" || fail "a bad secret file: $(cat "$TMP/err")"
timeout 10 "$B" serve --listen 127.0.0.1:0 --store memory: --secret-file "$TMP/bad-secret" >/dev/null 2>"$TMP/err"; [ $? = 1 ] &&
  grep -q "bad-secret" "$TMP/err" || fail "serve with a bad secret file does not stop, naming it: $(cat "$TMP/err")"

note "errors and usage"
for sub in create list show update disable rotate; do
  "$B" keys $sub --help | grep_q "usage: loopguard keys $sub" || fail "keys $sub --help"
done
"$B" keys show nope 2>"$TMP/err"; [ $? = 1 ] && grep -q 'no key nope' "$TMP/err" || fail "an unknown key: $(cat "$TMP/err")"
grep -q "keys.db" "$TMP/err" || fail "the error names the store: $(cat "$TMP/err")"
"$B" keys create x --reset hourly --limit-usd 1 2>"$TMP/err"; [ $? = 1 ] && grep -q limit_reset "$TMP/err" || fail "a bad reset: $(cat "$TMP/err")"
"$B" keys create x --limit-usd lots 2>"$TMP/err"; [ $? = 2 ] && grep -q -- --limit-usd "$TMP/err" || fail "a bad amount: $(cat "$TMP/err")"
"$B" keys create x --rate-limit 0 2>"$TMP/err"; [ $? = 2 ] || fail "a bad rate"
"$B" keys create x --byok nokey 2>"$TMP/err"; [ $? = 2 ] || fail "a bad byok"
"$B" keys create 2>"$TMP/err"; [ $? = 2 ] && grep -q 'needs a NAME' "$TMP/err" || fail "no name"
# The body is JSON: a name or flag that is not UTF-8 is named (it was "the
# body is not JSON: unable to decode byte 0xff", naming no field).
"$B" keys create $'n\xff' 2>"$TMP/err"; [ $? = 2 ] && grep -q 'NAME is not valid UTF-8' "$TMP/err" || fail "a NAME not UTF-8: $(head -n 1 "$TMP/err")"
"$B" keys create n --workspace $'w\xed\xa0\x80' 2>"$TMP/err"; [ $? = 2 ] && grep -q -- '--workspace is not valid UTF-8' "$TMP/err" ||
  fail "a workspace not UTF-8: $(head -n 1 "$TMP/err")"
"$B" keys update "$H" --models $'a,\xff' 2>"$TMP/err"; [ $? = 2 ] && grep -q -- '--models is not valid UTF-8' "$TMP/err" ||
  fail "update: models not UTF-8: $(head -n 1 "$TMP/err")"
# `none` clears a field: update takes it, create refuses it (it made a key
# whose only model was "none") and its --help does not offer it.
"$B" keys create --help | grep_q 'none: \(no limit\|any\)' && fail "keys create --help offers none: $("$B" keys create --help)"
"$B" keys update --help | grep_q -- '--models M1,M2|none .*(none: any)' || fail "keys update --help does not offer none"
for f in --limit-usd --workspace --rate-limit --models --byok; do
  "$B" keys create x $f none 2>"$TMP/err"; [ $? = 2 ] && grep -q -- "$f none: leave the flag out" "$TMP/err" ||
    fail "keys create $f none: $(head -n 1 "$TMP/err")"
done
"$B" keys frobnicate 2>"$TMP/err"; [ $? = 2 ] || fail "an unknown subcommand"
echo "PASS keys.sh"
