#!/usr/bin/env bash
# Runs one vLLM-suite test script in the vLLM venv (tools/install-vllm.sh makes it):
#   run-test.sh test_hit.py
# The venv is $KVR_VLLM_VENV, else $KVR_BUILD_ROOT/vllm-venv. No venv: exit 77 (meson: SKIP).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVR_VLLM_VENV:-${KVR_BUILD_ROOT:?KVR_BUILD_ROOT is not set}/vllm-venv}"
if [ ! -x "$venv/bin/python" ]; then
	echo "SKIP: no vLLM venv at $venv (tools/install-vllm.sh creates it)" >&2
	exit 77
fi
export PYTHONPATH="$here/../../client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$venv/bin/python" "$here/$1"
