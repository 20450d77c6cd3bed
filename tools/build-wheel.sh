#!/usr/bin/env bash
# Builds the kvring wheel: kvringd, every actor, kvring-inspect, libkvring and the Python
# package (binding, vLLM connector, vLLM plugin) in one installable file (docs/packaging.md).
#
#   tools/build-wheel.sh [--build-dir DIR] [OUTDIR] [-- MESON_OPTION...]
#
# The binaries come from a release build of their own (default DIR: build/wheel), configured
# on first use with -Dbuildtype=release (-O3, no debug info) and the
# MESON_OPTIONs (e.g. -Dcuda=disabled for a host-only wheel); later runs rebuild
# incrementally (options given again are applied with meson configure). OUTDIR defaults to build/wheelhouse. Jobs: $KVR_WHEEL_JOBS, else nproc.
# Prints the wheel's path (alone on stdout); `pip install --no-index <it>` needs nothing else.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="$src/build/wheel"
out="$src/build/wheelhouse"
meson_opts=()
while [ $# -gt 0 ]; do
	case "$1" in
	--build-dir) build="$2"; shift 2 ;;
	--build-dir=*) build="${1#*=}"; shift ;;
	--) shift; meson_opts=("$@"); break ;;
	-h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "build-wheel.sh: unknown option $1" >&2; exit 2 ;;
	*) out="$1"; shift ;;
	esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$src" -Dbuildtype=release "${meson_opts[@]}" >&2
elif [ ${#meson_opts[@]} -gt 0 ]; then
	meson configure "$build" "${meson_opts[@]}" >&2
fi
build="$(cd "$build" && pwd)"
exec python3 "$src/tools/mkwheel.py" --source "$src" --build-dir "$build" --out "$out" \
	--jobs "${KVR_WHEEL_JOBS:-$(nproc)}"
