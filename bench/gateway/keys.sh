#!/usr/bin/env bash
# bench/gateway/keys.sh BUILD_DIR — the cost of the key gate (issue 14):
# one run, one server, the same 8 KB Chat Completions body (body.py) at
# one connection with wrk, three ways:
#
#   direct   wrk -> the fake upstream (BUILD_DIR/bench/gw_bench_upstream)
#   no_key   wrk -> loopguard serve --prices (store memory:) -> the same
#   key      the same, with a loopguard key whose limit never refuses:
#            the key read from the store, its budget's reservation of the
#            worst case and the settlement from the usage, per request
#
# One JSON line ({"bench":"gateway","figure":"key_gate",...}: p50/p99 of
# each, the gateway's added latency without and with the key, and the
# gate's own share: with minus without) and a line for a person. Run by
# bench/run after bench/gateway/run.sh. Environment: LG_BENCH_QUICK=1
# (2 s runs), LG_GW_SECONDS (5). Exit 1 only when it could not run.
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.bash" # BUILD, LG, UP_BIN, SECONDS_PER, WORK, PIDS, note, calcf, start_upstream, serve_url
command -v wrk >/dev/null || { note "key gate: SKIPPED: wrk is not installed (make bench-deps)"; exit 0; }
[[ -x $UP_BIN && -x $LG ]] || { note "key gate: FAILED: $UP_BIN or $LG is missing (build first)"; exit 1; }

start_upstream "key gate"
# 1 USD a million input tokens, 2 output: a request's worst case is about a cent.
echo '{"models":{"bench":{"input_usd_per_mtok":1,"output_usd_per_mtok":2,"max_output_tokens":1000}}}' >"$WORK/prices.json"
serve_url "key gate" --prices "$WORK/prices.json"
KEY=$(curl -s -XPOST "$URL/v1/keys" -H 'Content-Type: application/json' \
  -d '{"name":"bench","limit_usd":1000000}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])') ||
  { note "key gate: FAILED: no key"; exit 1; }
python3 "$HERE/body.py" 8192 0 >"$WORK/body.json" || exit 1

wrk_ms() { awk -v s="$1" 'BEGIN { v = s + 0; if (s ~ /us$/) v /= 1000; else if (s ~ /s$/ && s !~ /ms$/) v *= 1000; printf "%.4f", v }'; }
declare -A P50 P99 RPS
for mode in direct no_key key; do
  target=$URL
  [[ $mode == direct ]] && target=$UP
  if [[ $mode == key ]]; then export LG_KEY=$KEY; else unset LG_KEY; fi
  LG_BODY=$WORK/body.json wrk -t1 -c4 -d1s -s "$HERE/agent.lua" "$target/v1/chat/completions" >/dev/null 2>&1 # warm up
  LG_BODY=$WORK/body.json wrk -t1 -c1 -d"${SECONDS_PER}s" --latency -s "$HERE/agent.lua" \
    "$target/v1/chat/completions" >"$WORK/wrk.out" 2>&1 || { note "key gate: FAILED: wrk: $(tail -n 2 "$WORK/wrk.out")"; exit 1; }
  if grep -q 'Non-2xx' "$WORK/wrk.out"; then note "key gate: FAILED: $mode answered errors: $(grep Non-2xx "$WORK/wrk.out")"; exit 1; fi
  P50[$mode]=$(wrk_ms "$(awk '$1 == "50%" { print $2 }' "$WORK/wrk.out")")
  P99[$mode]=$(wrk_ms "$(awk '$1 == "99%" { print $2 }' "$WORK/wrk.out")")
  RPS[$mode]=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$WORK/wrk.out")
done
unset LG_KEY
# The key's requests were charged: the gate did its work (else the figure is not its cost).
spent=$(curl -s "$URL/v1/budgets" | python3 -c 'import json,sys; print(sum(b["spent_usd"] for b in json.load(sys.stdin)["budgets"] if b["scope"].startswith("key:")))')
status=ok
python3 -c "import sys; sys.exit(0 if float('$spent') > 0 else 1)" || status=INVALID
c() { calcf "%.4f" "$1"; }
a50n=$(c "${P50[no_key]} - ${P50[direct]}") a50k=$(c "${P50[key]} - ${P50[direct]}")
a99n=$(c "${P99[no_key]} - ${P99[direct]}") a99k=$(c "${P99[key]} - ${P99[direct]}")
printf '{"bench":"gateway","figure":"key_gate","body_bytes":8192,"stream":false,"seconds":%d,"direct_p50_ms":%s,"no_key_p50_ms":%s,"key_p50_ms":%s,"no_key_added_p50_ms":%s,"key_added_p50_ms":%s,"gate_p50_ms":%s,"no_key_added_p99_ms":%s,"key_added_p99_ms":%s,"gate_p99_ms":%s,"no_key_rps":%s,"key_rps":%s,"key_spent_usd":%s,"status":"%s"}\n' \
  "$SECONDS_PER" "${P50[direct]}" "${P50[no_key]}" "${P50[key]}" "$a50n" "$a50k" "$(c "$a50k - $a50n")" \
  "$a99n" "$a99k" "$(c "$a99k - $a99n")" "${RPS[no_key]}" "${RPS[key]}" "$spent" "$status"
note "key gate, 8 KB, 1 conn: added p50 ${a50n} ms without a key, ${a50k} ms with a key limit (the gate: $(c "$a50k - $a50n") ms); p99 ${a99n} / ${a99k} ms; ${RPS[no_key]} / ${RPS[key]} req/s; $status"
