#!/usr/bin/env bash
# Installs kvring's build and test dependencies from Debian 12 packages. Idempotent.
set -euo pipefail

pkgs=(
  build-essential pkg-config meson ninja-build
  liburing-dev libcjson-dev libcriterion-dev libxxhash-dev libmicrohttpd-dev
  python3 curl procps util-linux
  fio gnuplot-nox prometheus
  chromium  # tests/metrics status_page: headless screenshot and DOM of kvringd's status page
  iceoryx libiceoryx-binding-c-dev
  redis-server redis-tools libhiredis-dev
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# prometheus pulls a service; keep it from starting under policy-rc.d-less containers
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
