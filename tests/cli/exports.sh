#!/usr/bin/env bash
# The shared library exports exactly the functions the public headers
# (loopguard.h and its topic headers, include/loopguard/*.h) declare with
# LG_EXPORT: internals (lg__*) never leak into the ABI, and
# nothing declared is missing. Checked with nm -D.
set -u
src=${LG_SOURCE_DIR:?}
lib=$(dirname "${LG_BIN:?}")/libloopguard.so
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAIL: $1"; fi; }
[ -f "$lib" ] || { echo "FAIL: no $lib"; echo "0 passed, 1 failed"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort -u)
declared=$(cat "$src/include/loopguard.h" "$src"/include/loopguard/*.h | grep -oE '^LG_EXPORT [^(]*\(' | sed -E 's/.*[ *]([a-z_0-9]+)\($/\1/' | sort -u)
leaked=$(comm -23 <(echo "$exported") <(echo "$declared"))
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
check "exported symbols not in the header: $(echo $leaked)" '[ -z "$leaked" ]'
check "declared but not exported: $(echo $missing)" '[ -z "$missing" ]'
check "every exported symbol has the lg_ prefix" '! echo "$exported" | grep -qv "^lg_"'
check "no internal lg__ symbol is exported" '! echo "$exported" | grep -q "^lg__"'
echo "exports: $(echo "$exported" | wc -l) symbols"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
