#!/usr/bin/env bash
# budget.sh — `loopguard budget set|show|list|reset` as operators and
# scripts call it (cli-v1.md): human output and --json, the exact JSON of
# GET /v1/budgets/{scope}, list order, reset keeping the limit, --help on
# every subcommand, errors that name what and where, exit codes 0/1/2.
#
# The store is a new SQLite file, or with LG_TEST_STORE=postgres the
# database of tests/pg/with-postgres.sh ($LG_PG_URL).
source "$(dirname "$0")/check_lib.bash"
use_store budget
export LOOPGUARD_STORE=$store

# set, in both output forms.
check "set" 0 "$bin" budget set key:alice --limit-usd 25 --period daily --max-in-flight-usd 2
has "set says" "set key:alice: 25 USD a day" "$out"
check "set json" 0 "$bin" budget set workspace:acme --limit-usd 1000.50 --period monthly --json
has "set json object" '{"scope":"workspace:acme","limit_usd":1000.5,"period":"monthly","spent_usd":0,"reserved_usd":0,"resets_at":"' "$out"
has "set json in-flight null" '"max_in_flight_usd":null' "$out"
check "set none" 0 "$bin" budget set team:ml --limit-usd=0.000042 --period=none
check "set weekly" 0 "$bin" budget set customer:7 --limit-usd 3 --period weekly

# show
check "show" 0 "$bin" budget show key:alice
has "show scope" "key:alice" "$out"
has "show limit" "25 USD a day (daily)" "$out"
has "show in flight" "max in flight  2 USD" "$out"
has "show resets" "resets at" "$out"
check "show json" 0 "$bin" budget show key:alice --json
has "show json" '"scope":"key:alice","limit_usd":25,"period":"daily","spent_usd":0,"reserved_usd":0' "$out"
has "show json mif" '"max_in_flight_usd":2,"remaining_usd":25,"open_reservations":0}' "$out"
check "show none" 0 "$bin" budget show team:ml --json
has "tiny limit exact" '"limit_usd":0.000042' "$out"
has "period none resets null" '"resets_at":null' "$out"
check "show none human" 0 "$bin" budget show team:ml
has "never resets" "resets at      never" "$out"

# list: by scope; --json one object per line.
check "list" 0 "$bin" budget list
has "list header" "SCOPE" "$out"
order=$(printf '%s\n' "$out" | awk 'NR > 1 { print $1 }' | paste -sd' ')
[ "$order" = "customer:7 key:alice team:ml workspace:acme" ]
ok "list order: $order" $?
check "list json" 0 "$bin" budget list --json
lines=$(printf '%s\n' "$out" | grep -c '^{"scope":')
[ "$lines" = 4 ]
ok "list json lines: $lines" $?

# set again: the limit changes; set replaces the in-flight cap.
check "set again" 0 "$bin" budget set key:alice --limit-usd 30 --period daily --json
has "new limit" '"limit_usd":30' "$out"
has "cap replaced" '"max_in_flight_usd":null' "$out"

# reset
check "reset" 0 "$bin" budget reset key:alice
has "reset says" "reset key:alice: spent 0 -> 0 USD" "$out"
check "reset json" 0 "$bin" budget reset key:alice --json
has "reset keeps limit" '"limit_usd":30' "$out"

# Errors name what and where; bad usage is 2.
check "show unknown" 1 "$bin" budget show key:nobody
has "names the scope" 'key:nobody' "$(cat "$tmp/err")"
has "names the store" "${store%%:*}:" "$(cat "$tmp/err")"
check "reset unknown" 1 "$bin" budget reset key:nobody
check "no limit" 2 "$bin" budget set key:x --period daily
has "says --limit-usd" "--limit-usd" "$(cat "$tmp/err")"
check "no period" 2 "$bin" budget set key:x --limit-usd 1
check "bad period" 2 "$bin" budget set key:x --limit-usd 1 --period hourly
has "names the choices" "daily, weekly, monthly, none" "$(cat "$tmp/err")"
check "negative" 2 "$bin" budget set key:x --limit-usd -1 --period daily
check "nan" 2 "$bin" budget set key:x --limit-usd nan --period daily
check "inf" 2 "$bin" budget set key:x --limit-usd inf --period daily
check "words" 2 "$bin" budget set key:x --limit-usd ten --period daily
check "too big" 2 "$bin" budget set key:x --limit-usd 1e12 --period daily
check "bad in-flight" 2 "$bin" budget set key:x --limit-usd 1 --period daily --max-in-flight-usd x
check "no scope" 2 "$bin" budget set --limit-usd 1 --period daily
check "bad scope" 2 "$bin" budget set "$(printf 'a\tb')" --limit-usd 1 --period daily
check "two scopes" 2 "$bin" budget show a b
check "unknown flag" 2 "$bin" budget show key:alice --colour
check "list extra" 2 "$bin" budget list extra
check "unknown sub" 2 "$bin" budget frobnicate
check "no sub" 2 "$bin" budget
check "x not set" 1 "$bin" budget show key:x
check "bad store" 1 "$bin" budget list --store mysql:nothing
has "bad store named" 'mysql:nothing' "$(cat "$tmp/err")"
check "unopenable sqlite" 1 "$bin" budget list --store "sqlite:$tmp/no/such/dir/x.db"
has "sqlite path named" "$tmp/no/such/dir/x.db" "$(cat "$tmp/err")"

# An empty store says so. (budget list never creates a store: a write —
# here an empty purge — makes the file first; tests/cli/newcomer.sh checks
# the refusal.)
"$bin" ledger purge --store "sqlite:$tmp/empty.db" >/dev/null
check "empty list" 0 "$bin" budget list --store "sqlite:$tmp/empty.db"
has "no budgets" "no budgets in" "$out"
check "empty list json" 0 "$bin" budget list --json --store "sqlite:$tmp/empty.db"
[ -z "$out" ]
ok "empty json list: $out" $?

# --help everywhere, explaining each flag, on stdout, status 0.
check "help" 0 "$bin" budget --help
has "help lists set" "budget set SCOPE" "$out"
for sub in set show list reset; do
  check "help $sub" 0 "$bin" budget "$sub" --help
  has "help $sub usage" "usage: loopguard budget $sub" "$out"
  has "help $sub store" "--store URL" "$out"
done
check "help set flags" 0 "$bin" budget set --help
has "help limit" "--limit-usd X" "$out"
has "help period" "--period P" "$out"
has "help mif" "--max-in-flight-usd Y" "$out"
check "top help" 0 "$bin" --help
has "top help budget" "budget set|show|list|reset" "$out"
hasnt "not pending" "not available" "$("$bin" budget list 2>&1)"

summary "budget.sh (store ${store%%:*})"
