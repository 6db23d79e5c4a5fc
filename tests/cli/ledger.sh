#!/usr/bin/env bash
# ledger.sh — `loopguard ledger claim|commit|fail|show|purge` as scripts
# call it (cli-v1.md): outcomes and their exit codes (0 claimed, 10 replay,
# 11 in_progress, 12 mismatch, 13 unknown_outcome, 1 error, 2 usage), the
# --json forms, the operator's resolution of an unknown_outcome, purge,
# --help on every subcommand, and errors that name what and where.
#
# The store is a new SQLite file, or with LG_TEST_STORE=postgres the
# database of tests/pg/with-postgres.sh ($LG_PG_URL).
source "$(dirname "$0")/check_lib.bash"
use_store ledger
export LOOPGUARD_STORE=$store

fp=$(printf '%064d' 7)
fp2=$(printf '%064d' 8)

check "claim" 0 "$bin" ledger claim pay-1 --fingerprint "$fp" --run run-1
has "claim says claimed" "claimed pay-1" "$out"
check "claim again" 11 "$bin" ledger claim pay-1 --fingerprint "$fp"
check "claim again json" 11 "$bin" ledger claim pay-1 --fingerprint "$fp" --json
has "in_progress json" '{"outcome":"in_progress"}' "$out"
check "mismatch" 12 "$bin" ledger claim pay-1 --fingerprint "$fp2" --json
has "mismatch json" '"mismatch"' "$out"
check "show in progress" 0 "$bin" ledger show pay-1 --json
has "show state" '"state":"in_progress"' "$out"
has "show run" '"run_id":"run-1"' "$out"
check "commit" 0 "$bin" ledger commit pay-1 --result '{"charge":"ch_1","n":1.50}' --operation-id ch_1
check "replay" 10 "$bin" ledger claim pay-1 --fingerprint "$fp"
has "replay shows result" '"charge":"ch_1"' "$out"
check "replay json" 10 "$bin" ledger claim pay-1 --fingerprint "$fp" --json
has "replay json result" '{"outcome":"replay","result":{"charge":"ch_1","n":1.50}}' "$out"
check "show committed" 0 "$bin" ledger show pay-1
has "show human" "committed" "$out"
has "show op id" "ch_1" "$out"
check "commit again keeps first" 0 "$bin" ledger commit pay-1 --result '2'
has "first outcome stands" "first outcome stands" "$out"

# A final failure replays as one; a retryable one frees the key.
check "claim f" 0 "$bin" ledger claim f --fingerprint "$fp"
check "fail final" 0 "$bin" ledger fail f
check "replay failure" 10 "$bin" ledger claim f --fingerprint "$fp" --json
has "failed flag" '"failed":true' "$out"
check "claim r" 0 "$bin" ledger claim r --fingerprint "$fp"
check "fail retryable" 0 "$bin" ledger fail r --retryable
check "claim r again" 0 "$bin" ledger claim r --fingerprint "$fp"

# A lease that runs out: unknown_outcome, until an operator resolves it.
check "short lease" 0 "$bin" ledger claim u --fingerprint "$fp" --lease-ms 1
sleep 0.05
check "unknown" 13 "$bin" ledger claim u --fingerprint "$fp"
has "unknown says how to resolve" "ledger commit u --result JSON" "$out"
check "unknown again" 13 "$bin" ledger claim u --fingerprint "$fp" --json
has "unknown json" '{"outcome":"unknown_outcome"}' "$out"
check "show unknown" 0 "$bin" ledger show u --json
has "show unknown state" '"state":"unknown_outcome"' "$out"
check "resolve by commit" 0 "$bin" ledger commit u --result '"reconciled"'
check "resolved replays" 10 "$bin" ledger claim u --fingerprint "$fp" --json
has "resolved result" '"result":"reconciled"' "$out"

# purge: finished rows only.
check "claim p" 0 "$bin" ledger claim pending --fingerprint "$fp"
check "purge recent none" 0 "$bin" ledger purge
has "purge default" "purged 0 finished operations older than 24h" "$out"
check "purge all finished" 0 "$bin" ledger purge --older-than 0s
has "purged some" "purged 3 finished operations" "$out"
check "pending kept" 11 "$bin" ledger claim pending --fingerprint "$fp"
check "purged gone" 1 "$bin" ledger show pay-1

# Errors name what and where; usage errors are 2.
check "commit unknown key" 1 "$bin" ledger commit nope --result 1
has "names the key" 'nope' "$(cat "$tmp/err")"
has "names the store" "${store%%:*}:" "$(cat "$tmp/err")"
check "fail unknown key" 1 "$bin" ledger fail nope
check "bad result json" 2 "$bin" ledger commit pay-1 --result '{bad'
has "bad json says --result" '--result' "$(cat "$tmp/err")"
check "key not UTF-8" 2 "$bin" ledger claim $'k\xff' --fingerprint "$fp" --json
has "key not UTF-8: named" "KEY is not valid UTF-8" "$(cat "$tmp/err")"
check "key not UTF-8: not stored" 1 "$bin" ledger show $'k\xff'
check "run with a control character" 2 "$bin" ledger claim k --fingerprint "$fp" --run $'r\x01'
has "run with a control character: named" "--run must not hold control characters" "$(cat "$tmp/err")"
check "operation id not UTF-8" 2 "$bin" ledger commit pay-1 --result 1 --operation-id $'\xff'
has "operation id not UTF-8: named" "--operation-id is not valid UTF-8" "$(cat "$tmp/err")"
check "no fingerprint" 2 "$bin" ledger claim k
check "no key" 2 "$bin" ledger claim --fingerprint "$fp"
check "bad lease" 2 "$bin" ledger claim k --fingerprint "$fp" --lease-ms soon
# The HTTP API's range, 0 (the store's lease) to 604800000 ms: a lease in
# the year 3170900 is refused, named, and nothing is claimed.
check "lease past a week" 2 "$bin" ledger claim k --fingerprint "$fp" --lease-ms 99999999999999999
has "lease past a week: the range" "--lease-ms wants a whole number of milliseconds from 0 (the store's lease) to 604800000" "$(cat "$tmp/err")"
check "lease of a week and 1 ms" 2 "$bin" ledger claim k --fingerprint "$fp" --lease-ms 604800001
check "lease below 0" 2 "$bin" ledger claim k --fingerprint "$fp" --lease-ms -1
check "lease past a week: nothing claimed" 1 "$bin" ledger show k
check "lease of 0: the store's" 0 "$bin" ledger claim zero --fingerprint "$fp" --lease-ms 0
check "lease of a week" 0 "$bin" ledger claim week --fingerprint "$fp" --lease-ms 604800000
check "bad duration" 2 "$bin" ledger purge --older-than 3 weeks
check "unknown flag" 2 "$bin" ledger show k --colour
check "unknown subcommand" 2 "$bin" ledger frobnicate
check "bad store" 1 "$bin" ledger show k --store mysql:nothing
has "bad store named" 'mysql:nothing' "$(cat "$tmp/err")"
check "unopenable sqlite" 1 "$bin" ledger show k --store "sqlite:$tmp/no/such/dir/x.db"
has "sqlite path named" "$tmp/no/such/dir/x.db" "$(cat "$tmp/err")"

# --help everywhere, explaining each flag, on stdout, status 0.
check "help" 0 "$bin" ledger --help
for sub in claim commit fail show purge; do
  check "help $sub" 0 "$bin" ledger "$sub" --help
  has "help $sub usage" "usage: loopguard ledger $sub" "$out"
done
check "help claim flags" 0 "$bin" ledger claim --help
for f in --fingerprint --lease-ms --run --store --json; do has "claim help $f" "$f" "$out"; done
check "help commit flags" 0 "$bin" ledger commit --help
for f in --result --operation-id --store; do has "commit help $f" "$f" "$out"; done

summary "ledger CLI ($store)"
