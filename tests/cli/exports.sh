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
# A public function (lg_, not lg__) defined in src/ whose declaration went
# missing is hidden by -fvisibility=hidden: it is neither declared nor
# exported, which the two checks above cannot see. Every one must be
# declared.
defined=$(grep -rhoE '^[a-z][a-z0-9_ ]*[ *]lg_[a-z0-9][a-z0-9_]*\(' "$src/src" --include='*.c' | grep -v '^static' |
          sed -E 's/.*[ *](lg_[a-z0-9_]+)\($/\1/' | sort -u)
undeclared=$(comm -23 <(echo "$defined") <(echo "$declared"))
check "public functions defined in src/ but declared in no public header: $(echo $undeclared)" '[ -z "$undeclared" ]'
check "the definitions of src/ were found ($(echo "$defined" | wc -l))" '[ "$(echo "$defined" | wc -l)" -gt 100 ]'
check "every exported symbol has the lg_ prefix" '! echo "$exported" | grep -v >/dev/null "^lg_"'
check "no internal lg__ symbol is exported" '! echo "$exported" | grep >/dev/null "^lg__"'
echo "exports: $(echo "$exported" | wc -l) symbols"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
