"""``mlaconf bench``: the golden generator's speed against float64 GEMM and PyTorch SDPA.

Why: production goldens cost TFLOPs in float64, so the reference must run near the machine's
float64 GEMM rate and beat what a user would otherwise reach for (torch SDPA in float64).

Definitions (also in docs/benchmarks.md):

- GEMM GF/s: ``2 n^3 / t`` for a square float64 ``a @ b`` with BLAS on ``--threads`` threads;
  the median over all samples, taken before and after the attention measurements.
- useful FLOPs: :func:`mlaconf.facts.operator.useful_flops`, ``2 * (192 + 128) * pairs * H`` where
  ``pairs`` counts the (query, key) pairs the mask allows (``S (S + 1) / 2`` causal, ``S^2``
  bidirectional).  Effective GF/s = useful FLOPs / median seconds, for any implementation.
- generator: :func:`mlaconf.golden.building.reference.reference_attention` (the float64 golden) with
  ``threads=--threads``; the emulated baseline is timed separately (``build_golden`` runs both).
- SDPA: ``torch.nn.functional.scaled_dot_product_attention`` in float64 with ``is_causal`` for
  causal cases, the same scale and ``torch.set_num_threads(--threads)``.  Its CPU float64 path
  materialises ``H x S x S`` scores, so when they exceed 512 MiB it runs on as many heads as fit
  (and, when one head does not fit, on the first query rows that do; its math path costs
  ``rows x S`` whatever the mask) and the time is scaled by ``H / heads x S / rows`` (marked ``~``).
- end to end: ``build_golden`` (inputs, reference, baseline, statistics) plus writing the file
  (``write_golden`` into a temporary directory), once, in a fresh interpreter with torch already
  imported (a worker pays that once, not per case): "e2e s", its effective GF/s against GEMM, and
  "e2e MB" its peak memory.
- ``--ab``: A/B interleaved in one fresh interpreter: per round a square float64 GEMM, the fused
  reference, the unfused numpy reference it replaced, an end-to-end build and ``tile_gemm`` (the
  reference's own two GEMM calls per tile, nothing between them; its GF/s counts the FLOPs it computes,
  masked corners included), in rotating order; each arm's effective GF/s divided by the GEMM GF/s of
  the same round, median and range over rounds, with the load average per round (the figures
  docs/benchmarks.md reports on a shared machine), and the reference against ``tile_gemm`` of the same
  round: the second denominator, the GEMM at the tiles' shapes.
- stage limits: per end-to-end build, each stage's time against the fastest its work allows
  (:mod:`mlaconf.golden.bench.limits`: its GEMMs at the square GEMM's float64 and float32 rates, one
  compiled softmax pass per score, its bytes at the copy bandwidth), and the end-to-end limit as a
  ratio to the float64 GEMM; ``--ab`` prints the same limit against its rounds' GEMM and how much of
  it the end-to-end arm reached.  Beside it a second limit, the same work with its GEMMs at the rates
  measured at the build's own tile shapes (:func:`mlaconf.golden.bench.limits.measure_tile_rates`: the
  shapes the memory target forces, which run below the square GEMM's rate).
- ``--tile-cost ROWS...``: the build's main stage (reference + magnitudes) at each query tile size, in a
  fresh interpreter: its time, its peak memory above the inputs and the float64 GEMM rate at that
  tile's shapes, against a square GEMM of the same process: what a larger tile gains and costs.
- peak MB: every measurement runs in a fresh interpreter; peak is its ``VmHWM`` (which, unlike
  tracemalloc, sees BLAS and torch buffers) minus its ``VmRSS`` right after imports.  "ref MB" is
  the same over the reference call alone (peak reset through ``/proc/self/clear_refs``), with the
  inputs already resident; "all MB" also covers generating the inputs.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from mlaconf.facts.processes import usable_cpus
from mlaconf.golden.bench.cases import CASES


def help_text(doc: str | None) -> str:
    """A docstring as --help prose: reST roles (``:func:`x```) and literals (````x````) as plain text."""
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", doc or "").replace("``", "")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure the float64 golden generator against GEMM and torch SDPA",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), help="cases to run (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    parser.add_argument("--threads", type=int, default=usable_cpus(), help="threads for every implementation")
    parser.add_argument("--tile", type=int, default=None, help="reference query tile (default: the path's own)")
    parser.add_argument("--gemm-size", type=int, default=4096, help="n of the square GEMM")
    parser.add_argument("--no-baseline", action="store_true", help="skip timing the emulated baseline")
    parser.add_argument(
        "--tile-profile",
        action="store_true",
        help="only profile one reference tile and its parts (one thread, CPU time)",
    )
    parser.add_argument("--no-end-to-end", action="store_true", help="skip the end-to-end build_golden run")
    parser.add_argument(
        "--tile-cost",
        nargs="+",
        type=int,
        metavar="ROWS",
        help="only measure the reference + magnitudes stage at these query tile sizes: time, peak memory, "
        "GEMM rate at the tiles' shapes",
    )
    parser.add_argument(
        "--ab",
        action="store_true",
        help="A/B interleaved ratios in one process: GEMM, fused reference, unfused reference, end to end, tile GEMMs",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the full report as JSON")
    parser.set_defaults(func="mlaconf.golden.bench.run:cmd_bench")
