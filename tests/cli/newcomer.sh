#!/usr/bin/env bash
# newcomer.sh — what a person meets in the first hour, without a server:
#   - read-only commands (runs list/show/trace, ledger show, budget
#     show/list) in an empty folder create no store, say which file they
#     looked for (its absolute path) and how to name another, exit 1;
#   - a command that writes creates the default store in the current
#     folder, and later messages name it by its absolute path;
#   - `loopguard --help` lists every subcommand; every --help has an exit
#     status line; `replay -` reads standard input; a trace that cannot be
#     opened prints nothing on stdout, only the error on stderr.
source "$(dirname "$0")/check_lib.bash"
src=${LG_SOURCE_DIR:?LG_SOURCE_DIR must name the source folder}
unset LOOPGUARD_STORE

# ---- read-only commands never create a store ----
mkdir "$tmp/empty"
cd "$tmp/empty" || exit 1
abs=$(pwd -P)
for cmd in "runs list" "runs show r1" "runs trace r1" "ledger show k1" \
           "budget show key:alice" "budget list"; do
  # shellcheck disable=SC2086
  check "$cmd in an empty folder" 1 "$bin" $cmd
  has "$cmd names the store" "no store at $abs/loopguard.db (set --store or LOOPGUARD_STORE)" "$err"
  [ -z "$(ls -A)" ]
  ok "$cmd created nothing: $(ls -A)" $?
  [ -z "$out" ]
  ok "$cmd printed nothing on stdout" $?
done
# The same for an explicit --store and for $LOOPGUARD_STORE, relative or not.
check "runs list --store relative" 1 "$bin" runs list --store sqlite:sub/x.db
has "relative --store made absolute" "no store at $abs/sub/x.db" "$err"
check "LOOPGUARD_STORE" 1 env LOOPGUARD_STORE=sqlite:./env.db "$bin" budget list
has "LOOPGUARD_STORE made absolute" "no store at $abs/env.db" "$err"
[ -z "$(ls -A)" ]
ok "nothing created by --store / LOOPGUARD_STORE" $?

# A write creates the default store here; reads then find it, and every
# message names it by its absolute path.
check "budget set creates the store" 0 "$bin" budget set key:alice --limit-usd 1 --period daily
[ -f loopguard.db ]
ok "loopguard.db created in the current folder" $?
check "budget list finds it" 0 "$bin" budget list
has "budget list lists" "key:alice" "$out"
check "runs show of a missing run" 1 "$bin" runs show nope
has "the error names the store's absolute path" "sqlite:$abs/loopguard.db" "$err"
cd "$tmp" || exit 1

# ---- help ----
check "loopguard --help" 0 "$bin" --help
for sub in "replay" "fingerprint" "serve" "runs list|show|trace|cancel" \
           "ledger claim|commit|fail|show|purge" "budget set|show|list|reset"; do
  has "--help lists $sub" "$sub" "$out"
done
has "--help names the claim codes" "10-13" "$out"
for cmd in "replay" "fingerprint" "serve" "runs" "runs list" "runs show" "runs trace" \
           "runs cancel" "ledger" "ledger claim" "ledger commit" "ledger fail" "ledger show" \
           "ledger purge" "budget" "budget set" "budget show" "budget list" "budget reset"; do
  # shellcheck disable=SC2086
  check "$cmd --help" 0 "$bin" $cmd --help
  has "$cmd --help has an exit status line" "Exit status" "$out"
done

# ---- replay ----
trace=$src/tests/data/fixtures/seed000-same-call.jsonl
check "replay - reads stdin" 0 sh -c "'$bin' replay --json - < '$trace'"
has "replay - summary" '"trace":"<stdin>"' "$out"
has "replay - stops" '"terminal_reason":"same_call_repeat"' "$out"
check "replay - twice" 1 sh -c "'$bin' replay --quiet - - < '$trace'"
has "replay - twice says why" "only once" "$err"
check "replay of a missing file" 1 "$bin" replay "$tmp/nosuch.jsonl"
[ -z "$out" ]
ok "a missing trace prints nothing on stdout (got: $out)" $?
has "the error names the file" "$tmp/nosuch.jsonl: cannot open" "$err"
check "replay: missing file, then a good one" 1 "$bin" replay "$tmp/nosuch.jsonl" "$trace"
first=$(printf '%s\n' "$out" | head -n 1)
[ "$first" = "$trace" ]
ok "the good trace's header comes first (got: $first)" $?

summary newcomer.sh
