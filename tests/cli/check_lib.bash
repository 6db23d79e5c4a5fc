# check_lib.bash — what the CLI scripts without a server share (sourced by
# ledger.sh, runs.sh, budget.sh, newcomer.sh, coding_agent_policy.sh): the binary, a temporary
# folder removed at exit, and checks that count instead of stopping, so one
# run reports every failure. After it: bin, tmp, pass, failed.
#
#   use_store NAME  $store: a new SQLite file $tmp/NAME.db, or with
#                   LG_TEST_STORE=postgres the database of
#                   tests/pg/with-postgres.sh ($LG_PG_URL)
#   check NAME STATUS CMD...   runs CMD: its exit status must be STATUS;
#                   its stdout in $out, its stderr in $err (and $tmp/err)
#   has NAME TEXT HAYSTACK     TEXT must be in HAYSTACK
#   hasnt NAME TEXT HAYSTACK   TEXT must not be
#   ok NAME STATUS             STATUS (a $?) must be 0
#   summary LABEL              the counts; the script's exit status
set -u
bin=${LG_BIN:?LG_BIN must name the loopguard binary}
tmp=$(mktemp -d /tmp/lgcli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 failed=0

use_store() {
  if [ "${LG_TEST_STORE:-sqlite}" = postgres ]; then
    : "${LG_PG_URL:?LG_PG_URL is not set (run through tests/pg/with-postgres.sh)}"
    store=$LG_PG_URL
  else
    store="sqlite:$tmp/$1.db"
  fi
}
check() {
  local name=$1 want=$2
  shift 2
  out=$("$@" 2>"$tmp/err")
  local got=$?
  err=$(cat "$tmp/err")
  if [ "$got" = "$want" ]; then
    pass=$((pass + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $name: exit $got, wanted $want"
    echo "  stdout: $out"
    echo "  stderr: $err"
  fi
}
has() {
  if printf '%s' "$3" | grep -qF -- "$2"; then
    pass=$((pass + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $1: '$2' not in: $3"
  fi
}
hasnt() {
  if printf '%s' "$3" | grep -qF -- "$2"; then
    failed=$((failed + 1))
    echo "FAIL: $1: '$2' unexpectedly in: $3"
  else
    pass=$((pass + 1))
  fi
}
ok() {
  if [ "$2" = 0 ]; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL: $1"; fi
}
summary() {
  echo "$1: $pass passed, $failed failed"
  [ "$failed" = 0 ]
}
