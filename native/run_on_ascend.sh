#!/usr/bin/env bash
# Validate the ATB harness on an Ascend A2/A3 machine, then run the smoke conformance suite.
#
# Needs: CANN toolkit and NNAL/ATB >= 8.2.RC1 with their set_env.sh sourced (ASCEND_HOME_PATH or
# ASCEND_TOOLKIT_HOME, and ATB_HOME_PATH set), torch + torch_npu, a C++17 compiler.
# Usage: native/run_on_ascend.sh [run-name]      (report: reports/out/<run-name>/)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${ATB_HOME_PATH:?source <nnal>/atb/set_env.sh first (ATB_HOME_PATH is unset)}"
ascend_home="${ASCEND_HOME_PATH:-${ASCEND_TOOLKIT_HOME:-}}"
: "${ascend_home:?source <cann>/set_env.sh first (ASCEND_HOME_PATH is unset)}"
run_name="${1:-atb-$(date +%Y%m%d-%H%M%S)-$(hostname -s)}"
cxx="${CXX:-g++}"

echo "== 1/4 build the extension (native._atb_harness)"
python -m pip install -e . --no-deps --no-build-isolation --quiet
python -c "import native._atb_harness"

echo "== 2/4 compat check: native/src/atb_abi.h against the installed headers"
CXX="$cxx" native/check_headers.sh "$ATB_HOME_PATH/include" "$ascend_home/include" "$ascend_home/include/aclnn"

echo "== 3/4 availability probe, then the NPU-marked tests (harness on the real libatb)"
python - <<'PY'
from mlaconf.harness.atb import AtbBackend

backend = AtbBackend()
availability = backend.available()
if not availability:
    raise SystemExit(f"ATB backend unavailable: {availability.reason}")
print(backend.info())
PY
python -m pytest -m npu -q -p no:cacheprovider

echo "== 4/4 smoke conformance run"
python -m pytest cases -n auto --mla-backend atb --mla-suite smoke --mla-run-name "$run_name"

echo "report: reports/out/$run_name/ (results.jsonl, run.json, report.html)"
