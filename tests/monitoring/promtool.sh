#!/bin/sh
# promtool with the arguments given, run from this script's directory's sibling
# monitoring/prometheus (rule files there name each other relatively); exit 77 (skip) when
# promtool is not installed.
command -v promtool >/dev/null 2>&1 || { echo "promtool not installed: skipped"; exit 77; }
cd "$(dirname "$0")/../../monitoring/prometheus" || exit 1
exec promtool "$@"
