#!/bin/sh
# An installed kvring builds a client: meson install into a temporary DESTDIR; the installed
# headers are kvring.h and kvr_geometry.h and declare exactly the functions of libkvring.map; then
# pkg-config kvring, compile and link installed_client.c against the installed headers and
# library only, run it and check its output. Negative control: a program that calls a
# function libkvring does not export (kvr_config_defaults) must fail to link.
# Needs KVR_BUILD_ROOT and KVR_SOURCE_ROOT (tests/meson.build sets them). Exit 0 pass, 1 fail.
set -eu

say() { printf 'test_install: %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

build=${KVR_BUILD_ROOT:?}
src=${KVR_SOURCE_ROOT:?}
cc=${CC:-cc}
tmp=$(mktemp -d /tmp/kvr-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The build directory is read, not changed: the install goes under $tmp/root only.
DESTDIR="$tmp/root" meson install -C "$build" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; fail "meson install failed"; }

pc=$(find "$tmp/root" -name kvring.pc -path '*/pkgconfig/*')
[ -n "$pc" ] || fail "no kvring.pc installed"
incdir=$(dirname "$(find "$tmp/root" -path '*/include/kvring/kvring.h')")
[ "$incdir" != . ] || fail "kvring/kvring.h not installed"
got=$(cd "$incdir" && LC_ALL=C ls | tr '\n' ' ')
[ "$got" = "kvr_geometry.h kvring.h " ] || fail "installed headers: $got(want kvr_geometry.h kvring.h)"
# every function an installed header declares (a file-scope line, not static inline) is exported
sed -n '/global:/,/local:/p' "$src/client/libkvring.map" | grep -oE '^[[:space:]]*kvr_[a-z0-9_]+;' |
	tr -d ' \t;' | sort -u >"$tmp/map.txt"
cat "$incdir"/*.h | grep -E '^[a-z]' | grep -v '^static' | grep -oE '\bkvr_[a-z0-9_]+\(' | tr -d '(' |
	sort -u >"$tmp/decl.txt"
diff "$tmp/decl.txt" "$tmp/map.txt" >"$tmp/decl.diff" ||
	{ cat "$tmp/decl.diff" >&2; fail "installed headers and libkvring.map differ (<: declared only, >: exported only)"; }

# kvring.pc names the configured prefix; the sysroot puts its paths under the DESTDIR.
# Nothing else on the search path: kvring.pc must not require another package.
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_LIBDIR="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
flags=$(pkg-config --cflags --libs kvring) || fail "pkg-config --cflags --libs kvring failed"
say "pkg-config kvring: $flags"
libdir=$(pkg-config --variable=libdir kvring)
case "$libdir" in "$tmp/root"/*) ;; *) libdir="$tmp/root$libdir" ;; esac # pkgconf applies the sysroot, pkg-config not
[ -e "$libdir/libkvring.so.0" ] || fail "libkvring.so.0 not in $libdir"
case "$flags" in *"-I$tmp/root/"*"-L$tmp/root/"*) ;; *) fail "flags do not point into the install: $flags" ;; esac

# A sanitizer build's library needs its runtime loaded first: build the client the same way.
san=
readelf -d "$libdir/libkvring.so.0" | grep -q 'libasan' && san="-fsanitize=address,undefined"
readelf -d "$libdir/libkvring.so.0" | grep -q 'libtsan' && san="-fsanitize=thread"

# shellcheck disable=SC2086 # $flags and $san are word lists
"$cc" -std=c11 -Wall -Wextra -Werror $san -o "$tmp/client" "$src/tests/client/installed_client.c" $flags ||
	fail "the client does not build against the installed kvring"
out=$(LC_ALL=C LD_LIBRARY_PATH="$libdir" "$tmp/client") || fail "the client exited $?: $out"
printf '%s\n' "$out"

# it ran against the installed library, not the build tree's
loaded=$(LD_LIBRARY_PATH="$libdir" ldd "$tmp/client" | awk '$1 == "libkvring.so.0" { print $3 }')
[ "$loaded" = "$libdir/libkvring.so.0" ] || fail "the client loads libkvring from '$loaded', not $libdir"

want='attach: Invalid argument (attach: missing geometry, KV memory or result pointer)
geometry: 4 regions, lane 1024 bytes, extent 4096 bytes
validate: ok at 4096 bytes; at 4095: region 3 (layer 1 V): block 3 ends at 4096 > kv_bytes 4095
set_region: offset 2^48 refused (Numerical result out of range)'
if [ "$out" != "$want" ]; then
	printf 'expected:\n%s\n' "$want" >&2
	fail "the client printed something else"
fi

# negative control: an internal function (kvr_config_defaults, the one that pulled in cJSON)
# is not in the installed library, so a program calling it does not link
cat >"$tmp/internal.c" <<'EOF'
#include <kvring/kvring.h>
struct kvr_config;
void kvr_config_defaults(struct kvr_config *cfg);
int main(void) { kvr_config_defaults(0); return 0; }
EOF
# shellcheck disable=SC2086
if "$cc" $san -o "$tmp/internal" "$tmp/internal.c" $flags >"$tmp/internal.log" 2>&1; then
	fail "a program calling kvr_config_defaults linked against the installed libkvring"
fi
grep -q 'undefined reference to .kvr_config_defaults' "$tmp/internal.log" ||
	{ cat "$tmp/internal.log" >&2; fail "linking kvr_config_defaults failed for another reason"; }
say "ok: installed client built and ran; an internal symbol does not link"
