#!/usr/bin/env bash
# Run on a machine with an NVIDIA GPU, from a checkout set up as the README says.
#  0. python -m mlaconf.tools.gpu_check: the device's float64 GEMM, the CUDA golden's GF/s against it, the
#     CUDA golden vs the numpy golden (<= 1e-12), build_golden end to end, torch-cuda's time;
#  1. the golden generator's float64 GPU path against its CPU path (within 1e-12 relative);
#  2. the smoke conformance suite on torch-cuda, plus flash-attn / flashinfer when importable
#     (they skip with the import error as the reason otherwise).
# The report lands in reports/out/$RUN_NAME/ (results.jsonl, run.json, report.html).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_NAME=${RUN_NAME:-cuda-$(date +%Y%m%d-%H%M%S)}
STORE=${MLA_GOLDEN_DIR:-.golden}

python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("GPUs:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PY

echo "== golden generator on the GPU: GF/s against the device's float64 GEMM"
python -m mlaconf.tools.gpu_check --json "gpu_check-$RUN_NAME.json" ${GPU_CHECK_ARGS:-}

echo "== golden generator: GPU float64 path vs CPU"
pytest tests/cover/test_reference.py -q -p no:cacheprovider -k "cuda or torch"
mlaconf regen smoke --out "$STORE"                          # CPU goldens
MLA_GOLDEN_DEVICE=cuda mlaconf verify smoke --recompute --out "$STORE"   # recomputed on the GPU

echo "== conformance: smoke on torch-cuda, flash-attn, flashinfer"
pytest cases -n auto -p no:cacheprovider --mla-suite smoke --mla-golden-dir "$STORE" \
    --mla-backend torch-cuda --mla-backend flash-attn --mla-backend flashinfer \
    --mla-timing-repeats 5 --mla-warmup 2 --mla-run-name "$RUN_NAME" -rs
echo "report: reports/out/$RUN_NAME/report.html"
