#!/usr/bin/env bash
# mutate.sh — the gateway under mutated conversations and mutated answers.
#
# mutate.mjs sends 600 requests a seed (the three APIs, stream false and
# true), each a valid conversation with tool calls mutated by a seed:
# values of other types, members gone or doubled, odd strings and numbers,
# bytes cut or changed. 40% go to the fake upstream's mutant-SEED model,
# whose answer (its JSON body, or some of its stream's events, or their
# bytes) is mutated too; one request in ten hangs up after 0 to 30 ms. On
# the embedded memory: store, then on a SQLite file (PostgreSQL under
# pg_gateway_mutate).
#
# Asserts: every answer is one the client can read (200 with JSON or a
# stream of JSON events, or an error in the route's API shape, never a
# 500); the trace of each of the twelve runs that half the requests share
# replays to the envelope the server keeps for it (the same decisions,
# counters and stop); the server answers a plain request normally
# afterwards and stops cleanly (under the ASan build: no sanitizer report,
# no leak). The fake's provider checks are not asserted here: the client
# itself sends conversations a provider rejects, and the gateway passes
# them on as they are (the provider's 400 comes back).
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # HERE, FAKE, client
get() { jq_py "$1"; }

# mutate_seeds NAME SEED...: each seed's requests to server NAME, then the
# traces of the runs they share replayed.
mutate_seeds() {
  local name=$1 seed k runs out rc
  shift
  local url_var="${name}_URL"
  local url=${!url_var}
  for seed in "$@"; do
    note "${MUTATE_N:-600} mutated requests (seed $seed, $name): every answer readable, no 500"
    out=$(BASE_URL="$url" N="${MUTATE_N:-600}" SEED="$seed" node "$HERE/mutate.mjs")
    rc=$?
    echo "$out" | get 'd["by_status"]'
    [ $rc = 0 ] || fail "answers a client cannot read: $(echo "$out" | get '"\n".join(d["bad"][:5])')"
    [ "$(echo "$out" | get 'd["sent"]')" = "${MUTATE_N:-600}" ] || fail "not every request was answered: $out"
    # not all refused: the guard and the answers were reached
    [ "$(echo "$out" | get 'int(d["by_status"].get("200", 0) >= 50)')" = 1 ] || fail "too few answers of 200: $out"
    stats 'd["malformed"]' >/dev/null || fail "the fake upstream died"

    # Half the requests share twelve runs: each run's trace, whatever odd
    # history it holds, replays to the envelope the server keeps.
    runs=0
    for k in $(seq 0 11); do
      curl -sf -o "$TMP/run.json" "$url/v1/runs/mut-$seed-$k" || continue
      curl -sf -o "$TMP/run.jsonl" "$url/v1/runs/mut-$seed-$k/trace" || fail "trace of mut-$seed-$k"
      "$LG_BIN" replay --json "$TMP/run.jsonl" >"$TMP/replay.out" || fail "replay of mut-$seed-$k: $(tail -n 3 "$TMP/replay.out")"
      tail -n 1 "$TMP/replay.out" >"$TMP/replay.sum"
      python3 - "$TMP/run.json" "$TMP/replay.sum" <<'PY' || fail "mut-$seed-$k ($name): its trace replays to another envelope"
import json, sys
kept, replayed = json.load(open(sys.argv[1]))["envelope"], json.load(open(sys.argv[2]))["envelope"]
if kept != replayed:
    for k in sorted(set(kept) | set(replayed)):
        if kept.get(k) != replayed.get(k):
            print(f"  {k}: kept {json.dumps(kept.get(k))[:300]}\n  {k}: replay {json.dumps(replayed.get(k))[:300]}")
    sys.exit(1)
PY
      runs=$((runs + 1))
    done
    [ "$runs" -ge 6 ] || fail "only $runs of the twelve shared runs exist"
  done
}

# MUTATE_SEEDS ("1 2 3 4"; on SQLite MUTATE_SQLITE_SEEDS, "5") and
# MUTATE_N (600 a seed) choose the requests: another seed is another set
# (docs/testing.md: a sweep of seeds).
start_server gw --store memory: --upstream "$FAKE/v1" --log "$TMP/gw.log"
mutate_seeds gw ${MUTATE_SEEDS:-1 2 3 4}
# The same on a SQLite file (LG_TEST_STORE=postgres, under
# tests/pg/with-postgres.sh: on PostgreSQL): a run born, read back and
# saved by a real store.
STORE2="sqlite:$TMP/mutate.db"
if [ "${LG_TEST_STORE:-}" = postgres ]; then
  [ -n "${LG_PG_URL:-}" ] || { echo "SKIP: no LG_PG_URL (run under tests/pg/with-postgres.sh)"; exit 77; }
  STORE2=$LG_PG_URL
fi
start_server gs --store "$STORE2" --upstream "$FAKE/v1" --log "$TMP/gs.log"
mutate_seeds gs ${MUTATE_SQLITE_SEEDS:-5}

note "afterwards: alive, and a plain request is answered as before"
curl -sf "$gw_URL/healthz" >/dev/null || fail "healthz after the mutations"
a=$(curl -sf -H "Content-Type: application/json" -d '{"model":"finish","messages":[{"role":"user","content":"x"}]}' \
  "$gw_URL/v1/chat/completions") || fail "a plain request after the mutations"
[ "$(echo "$a" | get 'd["choices"][0]["message"]["tool_calls"][0]["function"]["name"]')" = lookup ] || fail "plain: $a"

note "a clean stop"
stop_server gw
stop_server gs
! grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$TMP"/*.err || fail "a sanitizer's report"
echo "PASS"
