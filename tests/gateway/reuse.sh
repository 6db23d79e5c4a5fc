#!/usr/bin/env bash
# reuse.sh — the gateway keeps its upstream connections under load: 64
# agents at once, 32 requests each, through `loopguard serve --upstream`
# with one HTTP thread; the fake upstream counts the TCP connections it
# accepted. Each request in flight needs a connection of its own, so 64
# at once need 64; every connection more was one closed and opened again,
# which to a provider is a TLS handshake more
# (until session 33 a fiber's connection went with the fiber: 266 to 388
# connections for these 2,048 requests). The fibers are kept the same way
# (loopguard_gateway_fibers_made_total).
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the clients, the fake upstream: HERE, FAKE
conns() { stats 'd["connections"]'; }
start_server r --store memory: --upstream "$FAKE/v1" --threads 1 --log "$TMP/r.log"

note "64 agents at once, 32 requests each: the upstream connections kept, not opened again"
c0=$(conns) || fail "the fake upstream's stats"
out=$(BASE_URL="$r_URL/v1" AGENTS=64 EACH=32 node "$HERE/reuse.mjs") || fail "reuse.mjs: $out"
c1=$(conns) || fail "the fake upstream's stats"
n=$((c1 - c0 - 1)) # less the second stats request's own
m=$(curl -sf "$r_URL/metrics") || fail "no metrics"
f=$(echo "$m" | awk '$1 == "loopguard_gateway_fibers_made_total" { print $2 }')
w=$(echo "$m" | awk '$1 ~ /^loopguard_gateway_workers\{/ { n += $2 } END { print n + 0 }')
echo "  2048 requests, $n upstream connections opened, $f fibers made, $w workers"
# Each fiber keeps its libcurl handle, and with it its connection; a
# worker keeps its own. On a quiet machine the loop's thread runs all 64
# at once on 64 fibers: 64 connections (alone, and beside run.sh and
# passthrough.sh: 64 every time). In a clean clone's make test (the suite
# -j3 and two builds beside it) 108 once: a loaded machine passes the loop
# to another thread now and then, with handles of its own. So the bound is
# what was made and one more thread's 64, far under what a connection per
# request cost without reuse (266 to 388).
[ -n "$f" ] && [ "$n" -ge 1 ] && [ "$n" -le $((f + w + 64)) ] ||
  fail "$n connections upstream for 2048 requests of 64 agents at once (at most $f fibers + $w workers + 64)"
# and the fibers they ran on kept too: made once, not a stack mapped and
# unmapped again for every request past 16 at once (until session 34):
# 64 a thread that led the loop
[ "$f" -ge 1 ] && [ "$f" -le 160 ] || fail "$f fibers made for 2048 requests of 64 agents at once (at most 160)"
curl -sf "$r_URL/healthz" >/dev/null || fail "the server stopped serving"

stop_server r
fakes_clean
echo "PASS"
