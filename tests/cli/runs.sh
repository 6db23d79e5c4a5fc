#!/usr/bin/env bash
# runs.sh — `loopguard runs list|show|cancel|purge` without a server: the kill
# switch for a run that is not in the store yet, group cancels, an empty
# list, errors that name what and where, and --help on every subcommand.
# (Runs saved by the engine are listed and shown by
# tests/unit/test_store_cli.c, which can create them through the API.)
source "$(dirname "$0")/check_lib.bash"
use_store runs

# runs list never creates a store (tests/cli/newcomer.sh): an empty purge
# writes it first.
"$bin" ledger purge --store "$store" >/dev/null
check "empty list" 0 "$bin" runs list --store "$store"
has "says empty" "no runs in" "$out"
# With filters, the message says that nothing matches them, not that the
# store is empty.
check "no match" 0 "$bin" runs list --store "$store" --status stopped --group batch --reason step_cap
has "no match: the filters named" "match --status stopped --group batch --reason step_cap" "$out"
check "empty list json" 0 "$bin" runs list --store "$store" --json
[ -z "$out" ]
ok "json list not empty: $out" $?

# The kill switch before the run exists.
check "cancel future run" 0 "$bin" runs cancel night-42 --reason "runaway billing" --store "$store"
has "not stored yet" "not in the store yet" "$out"
has "reason echoed" "runaway billing" "$out"
check "cancel json" 0 "$bin" runs cancel night-43 --store "$store" --json
has "cancel json" '{"run_id":"night-43","reason":"operator_cancelled_loop","operator_note":null,"stored":false,"envelope":null}' "$out"
check "cancel group" 0 "$bin" runs cancel --group batch --reason stop --store "$store" --json
has "group json" '{"group":"batch","reason":"operator_cancelled_loop","operator_note":"stop","cancelled":[]}' "$out"
check "default store from env" 0 env LOOPGUARD_STORE="$store" "$bin" runs cancel night-44
# What the HTTP API refuses is refused here, naming the argument (its
# --json echoed bytes that are not UTF-8 and stored control characters).
check "cancel an id not UTF-8" 2 "$bin" runs cancel $'bad\xffid' --store "$store" --json
has "cancel an id not UTF-8: named" "RUN_ID is not valid UTF-8" "$err"
[ -z "$out" ]
ok "cancel an id not UTF-8: nothing printed: $out" $?
check "cancel an id with a control character" 2 "$bin" runs cancel $'bad\x01id' --store "$store"
has "cancel a control character: named" "RUN_ID must not hold control characters" "$err"
check "cancel a group not UTF-8" 2 "$bin" runs cancel --group $'g\xff' --store "$store" --json
has "cancel a group not UTF-8: named" "--group is not valid UTF-8" "$err"
check "cancel a reason with a tab" 2 "$bin" runs cancel r1 --reason $'a\tb' --store "$store"
has "cancel a reason with a tab: named" "--reason must not hold control characters" "$err"
check "resume a note not UTF-8" 2 "$bin" runs resume r1 --note $'\xc0\xaf' --store "$store"
has "resume a note not UTF-8: named" "--note is not valid UTF-8" "$err"

# Errors and usage.
check "show missing" 1 "$bin" runs show nope --store "$store"
has "names the run" '"nope"' "$(cat "$tmp/err")"
has "names the store" "${store%%:*}:" "$(cat "$tmp/err")"
check "show needs id" 2 "$bin" runs show --store "$store"
check "cancel needs id" 2 "$bin" runs cancel --store "$store"
check "cancel both" 2 "$bin" runs cancel a --group b --store "$store"
check "bad status" 2 "$bin" runs list --status paused --store "$store"
check "bad limit" 2 "$bin" runs list --limit -3 --store "$store"
check "unknown sub" 2 "$bin" runs frob
check "no sub" 2 "$bin" runs
check "purge needs an age" 2 "$bin" runs purge --store "$store"
has "purge says what is missing" "needs --older-than DURATION" "$(cat "$tmp/err")"
check "purge bad age" 2 "$bin" runs purge --older-than soon --store "$store"
has "purge names the value" "'soon'" "$(cat "$tmp/err")"
# A sum of terms past the maximum is refused, not wrapped round to 1 ms
# (which purged every run).
big=4611686018427387903ms
check "purge an age that overflows" 2 "$bin" runs purge --older-than "$big$big$big${big}5ms" --store "$store" --json
has "purge an age that overflows: named" "--older-than wants a duration" "$(cat "$tmp/err")"
check "purge the largest age" 0 "$bin" runs purge --older-than "$big" --store "$store" --json
has "purge the largest age: kept" '"older_than_ms":4611686018427387903' "$out"
check "purge an age past the largest" 2 "$bin" runs purge --older-than "${big}1ms" --store "$store"
check "purge nothing" 0 "$bin" runs purge --older-than 30d --store "$store"
has "purge counts" "purged 0 runs not written to for 30d" "$out"
check "purge no store" 1 "$bin" runs purge --older-than 1d --store "sqlite:$tmp/none.db"
has "purge creates no store" "no store at" "$(cat "$tmp/err")"
[ ! -e "$tmp/none.db" ]
ok "purge created a store" $?
check "bad store" 1 "$bin" runs list --store "postgres:host=$tmp/nosocket dbname=x"
has "pg error named" "cannot connect to PostgreSQL" "$(cat "$tmp/err")"

check "help" 0 "$bin" runs --help
for sub in list show cancel purge; do
  check "help $sub" 0 "$bin" runs "$sub" --help
  has "help $sub usage" "usage: loopguard runs $sub" "$out"
  has "help $sub store" "--store URL" "$out"
done
check "help cancel" 0 "$bin" runs cancel --help
for f in --reason --group --json; do has "cancel help $f" "$f" "$out"; done
# --reason is a note: the terminal reason stays operator_cancelled_loop.
has "cancel help: --reason is the operator_note" "kept as the envelope's operator_note" "$out"
hasnt "cancel help: --reason is not the terminal reason" "becomes the" "$out"
check "help list" 0 "$bin" runs list --help
for f in --status --limit --json; do has "list help $f" "$f" "$out"; done

summary "runs CLI ($store)"
