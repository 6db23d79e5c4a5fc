#!/usr/bin/env bash
# install.sh — `cmake --install` (what `make install PREFIX=P` runs) into a
# temporary prefix, then a small C program built against it with nothing
# but pkg-config, twice: linked to the shared library (run with the
# prefix's lib/ on LD_LIBRARY_PATH), and linked to the static archive with
# `pkg-config --static` (from a copy of the prefix without the .so, so the
# linker cannot pick the shared one). Both must print the same fingerprint
# as the installed `loopguard fingerprint`, and open a sqlite: store.
# Also: loopguard.pc names the prefix it was installed to, and its Cflags
# carry no folder of a dependency (the public header includes none); every
# topic header (include/loopguard/*.h) is installed and compiles alone, in
# C and C++; and a program that includes only <loopguard/core.h> builds,
# links and prints the same fingerprint.
set -u -o pipefail
bin=${LG_BIN:?LG_BIN must name the loopguard binary}
build=$(cd "$(dirname "$bin")" && pwd)
tmp=$(mktemp -d /tmp/lginst.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 failed=0
ok() { # NAME STATUS [DETAIL]
  if [ "$2" = 0 ]; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL: $1 ${3:-}"; fi
}
cc=${CC:-cc}
extra=()
# A sanitizer build's library needs the sanitizer runtime in the program.
if grep -q '^LG_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  extra=(-fsanitize=address,undefined)
fi

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1
ok "cmake --install" $? "$(cat "$tmp/install.log")"
pc=$(find "$prefix" -name loopguard.pc | head -n 1)
[ -n "$pc" ]
ok "loopguard.pc installed" $?
pcdir=$(dirname "$pc")
grep -qx "prefix=$prefix" "$pc"
ok "loopguard.pc names the install prefix" $? "$(head -n 1 "$pc")"

cflags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags loopguard)
ok "pkg-config --cflags" $?
[ "$(echo $cflags)" = "-I$prefix/include" ]
ok "Cflags are the prefix's include folder only" $? "(got: $cflags)"
libs=$(PKG_CONFIG_PATH=$pcdir pkg-config --libs loopguard)
ok "pkg-config --libs" $?
slibs=$(PKG_CONFIG_PATH=$pcdir pkg-config --static --libs loopguard)
ok "pkg-config --static --libs" $?

cat >"$tmp/prog.c" <<'C'
#include <loopguard.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
  const char *args = "{\"invoice_id\":\"INV-2291\",\"amount\":10.0}";
  lg_canon_t *c = lg_canon_new();
  char hex[LG_FP_HEX];
  lg_error_t err = {0};
  if (!c || lg_canon_fingerprint(c, NULL, "charge_invoice", args, strlen(args), hex, NULL, NULL, &err))
    return 1;
  lg_canon_free(c);
  lg_store_t *s = lg_store_open(argv[1], NULL, &err);
  if (!s) {
    char buf[1024];
    fprintf(stderr, "%s\n", lg_error_format(&err, buf, sizeof buf));
    return 1;
  }
  printf("%s %s %s\n", lg_version(), lg_store_scheme(s), hex);
  lg_store_close(s);
  return argc == 2 ? 0 : 1;
}
C
want=$("$prefix/bin/loopguard" fingerprint --json charge_invoice '{"invoice_id":"INV-2291","amount":10.0}' |
       sed 's/.*"fingerprint":"\([0-9a-f]*\)".*/\1/')
[ ${#want} = 64 ]
ok "the installed loopguard prints a fingerprint" $? "($want)"

# Shared.
# shellcheck disable=SC2086
"$cc" "${extra[@]}" -o "$tmp/prog-shared" "$tmp/prog.c" $cflags $libs 2>"$tmp/cc.log"
ok "build against the shared library" $? "$(cat "$tmp/cc.log")"
got=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/prog-shared" "sqlite:$tmp/shared.db")
ok "the shared program runs" $? "$got"
[ "$got" = "$("$prefix/bin/loopguard" --version | cut -d' ' -f2) sqlite $want" ]
ok "the shared program's answer" $? "(got: $got, fingerprint $want)"
# ldd's whole output first: grep -q stops reading at the first match, and
# with pipefail the SIGPIPE of a writer cut short fails the pipeline (the
# test failed now and then on a loaded machine).
deps=$(LD_LIBRARY_PATH=$prefix/lib ldd "$tmp/prog-shared" 2>/dev/null)
grep -qF "$prefix/lib/libloopguard.so" <<<"$deps"
ok "the shared program uses the installed .so" $?

# Static: a copy of the prefix with no shared library in it.
sprefix=$tmp/static
cmake --install "$build" --prefix "$sprefix" >/dev/null 2>&1
find "$sprefix" -name 'libloopguard.so*' -delete
spc=$(dirname "$(find "$sprefix" -name loopguard.pc | head -n 1)")
scflags=$(PKG_CONFIG_PATH=$spc pkg-config --static --cflags loopguard)
slibs=$(PKG_CONFIG_PATH=$spc pkg-config --static --libs loopguard)
# shellcheck disable=SC2086
"$cc" "${extra[@]}" -o "$tmp/prog-static" "$tmp/prog.c" $scflags $slibs 2>"$tmp/cc.log"
ok "build against the static library (pkg-config --static)" $? "$(cat "$tmp/cc.log") [$slibs]"
if [[ "$(ldd "$tmp/prog-static" 2>/dev/null)" == *libloopguard* ]]; then # (not `| grep -q`: pipefail)
  failed=$((failed + 1)); echo "FAIL: the static program still needs libloopguard.so"
else
  pass=$((pass + 1))
fi
got=$("$tmp/prog-static" "sqlite:$tmp/static.db")
ok "the static program runs" $? "$got"
[ "${got##* }" = "$want" ]
ok "the static program's fingerprint" $? "(got: $got)"

# The topic headers: the installed set is the source's, and each compiles
# alone (pedantic C11 and C++, no warning) against the installed prefix.
src=${LG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
want_h=$(cd "$src/include/loopguard" && ls ./*.h | sort)
got_h=$(cd "$prefix/include/loopguard" 2>/dev/null && ls ./*.h | sort)
[ -n "$want_h" ] && [ "$want_h" = "$got_h" ]
ok "the topic headers are installed" $? "(want: $(echo $want_h), got: $(echo $got_h))"
for h in $want_h; do
  h=${h#./}
  printf '#include <loopguard/%s>\nint main(void) { return 0; }\n' "$h" >"$tmp/alone.c"
  # shellcheck disable=SC2086
  "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $cflags "$tmp/alone.c" 2>"$tmp/cc.log"
  ok "<loopguard/$h> alone compiles as C11" $? "$(cat "$tmp/cc.log")"
  if command -v c++ >/dev/null; then
    # shellcheck disable=SC2086
    c++ -x c++ -Wall -Wextra -Werror -fsyntax-only $cflags "$tmp/alone.c" 2>"$tmp/cc.log"
    ok "<loopguard/$h> alone compiles as C++" $? "$(cat "$tmp/cc.log")"
  fi
done
cat >"$tmp/core.c" <<'C'
#include <loopguard/core.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  const char *args = "{\"invoice_id\":\"INV-2291\",\"amount\":10.0}";
  lg_canon_t *c = lg_canon_new();
  char hex[LG_FP_HEX];
  if (!c || lg_canon_fingerprint(c, NULL, "charge_invoice", args, strlen(args), hex, NULL, NULL, NULL))
    return 1;
  lg_canon_free(c);
  printf("%s\n", hex);
  return 0;
}
C
# shellcheck disable=SC2086
"$cc" "${extra[@]}" -o "$tmp/prog-core" "$tmp/core.c" $cflags $libs 2>"$tmp/cc.log"
ok "a program with only <loopguard/core.h> builds" $? "$(cat "$tmp/cc.log")"
got=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/prog-core")
[ "$got" = "$want" ]
ok "the core-only program's fingerprint" $? "(got: $got, want $want)"

echo "install.sh: $pass passed, $failed failed"
[ "$failed" = 0 ]
