#!/usr/bin/env bash
# The one command to run on an Ascend A2/A3 machine: build the extension and check atb_abi.h against
# the installed headers, probe the chip, ATB/CANN release and driver, regenerate the smoke goldens, run
# smoke on every available NPU backend (atb, ring-mla, npu-fia) and on torch-cpu over the same goldens,
# diff ATB against each of them, and pack everything into <out>.tar.gz to send back (native/README.md).
#
# Needs (except with --dry-run): CANN toolkit and NNAL/ATB >= 8.2.RC1 with their set_env.sh sourced,
# torch + torch_npu, a C++17 compiler.
# Usage: native/run_on_ascend.sh [--out DIR] [--dry-run] [--no-build] [-n JOBS]   (mlaconf ascend --help)
# Exit: 0 all ran and passed; 3 stopped at the probe (no NPU backend can run; the output says why);
# any other non-zero: a step or a smoke run failed (its log is in <out>/logs/).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dry_run=0
for arg in "$@"; do [[ "$arg" == "--dry-run" ]] && dry_run=1; done
if [[ $dry_run == 0 ]]; then
    : "${ATB_HOME_PATH:?source <nnal>/atb/set_env.sh first (ATB_HOME_PATH is unset)}"
    : "${ASCEND_HOME_PATH:=${ASCEND_TOOLKIT_HOME:-}}"
    : "${ASCEND_HOME_PATH:?source <cann>/set_env.sh first (ASCEND_HOME_PATH is unset)}"
    export ASCEND_HOME_PATH
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, also before the build installs it
exec "${PYTHON:-python}" -m mlaconf ascend "$@"
