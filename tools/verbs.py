"""The tools' command lines (``run``, ``shrink``, ``repro``, ``ascend``, ``import-dump``, ``power``,
``coverage``), light to import (no torch): every help and usage error builds them; each verb's work is its own
module's (:mod:`mlaconf.tools.run`, :mod:`mlaconf.tools.repro`, :mod:`mlaconf.tools.ascend`,
:mod:`mlaconf.tools.import_dump`, :mod:`mlaconf.tools.power_report`, :mod:`mlaconf.tools.coverage_report`),
imported when the verb runs (docs/architecture.md, "A CLI that starts at once")."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from mlaconf.harness.registry import AUTO_ORDER, BUILTIN
from mlaconf.runner.selection import DEFAULT_SUITE, suite_choices
from mlaconf.tools.ascend import STOPPED_AT_PROBE
from mlaconf.tools.power_report import DEFAULT_OUT

#: Default wall-clock budget of ``shrink``, in seconds.
DEFAULT_BUDGET_S = 300.0
#: Uncovered tuples ``coverage`` prints per strength unless --show says otherwise.
DEFAULT_SHOW = 10


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "test_id", metavar="TEST_ID", help="a conformance test id (…test_conformance[CASE-BACKEND]) or CASE id"
    )
    parser.add_argument("--backend", default=None, help="the backend (default: the one the test id ends with)")
    parser.add_argument("--cases", type=Path, default=None, metavar="FILE", help="the suite file holding the case")
    parser.add_argument("--policy", default="default", help="tolerance policy (default: default)")


def _shrink_repro(subparsers: Any) -> None:
    shrink_parser = subparsers.add_parser(
        "shrink",
        help="the smallest spec still failing by the same check",
        description="Search for the smallest spec (batch, lengths, heads, prefix, layout, distribution) that still "
        "fails by the same deciding check on the same backend, goldens built on the fly; print its TOML and the "
        "size reduction. Ctrl-C or the time budget keeps the best so far.",
    )
    _common(shrink_parser)
    shrink_parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS", help="time budget")
    shrink_parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="a candidate must fail N times (nondeterministic backends)"
    )
    shrink_parser.set_defaults(func="mlaconf.tools.repro:run_shrink")
    repro_parser = subparsers.add_parser(
        "repro",
        help="a directory that reruns one case without mlaconf",
        description="Write a directory a kernel engineer can run without mlaconf: the inputs and golden (case.npz), "
        "the call's arguments, the verdict with its likely cause, the environment, a standalone program and a README.",
    )
    _common(repro_parser)
    repro_parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="the directory to write")
    repro_parser.set_defaults(func="mlaconf.tools.repro:run_repro")


def _run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="conformance run (default: smoke suite on the best available backend, -n auto)",
        description="Runs the conformance suites under pytest; goldens missing from the store are "
        "generated on demand. Arguments after '--' go to pytest (e.g. -- --lf -k causal); paths or node ids "
        "among them replace the installed suites (-- cases/test_conformance.py).",
    )
    parser.add_argument(
        "--suite", action="append", choices=suite_choices(), help=f"a suite (default {DEFAULT_SUITE}); repeatable"
    )
    parser.add_argument(
        "--backend",
        action="append",
        help=f"auto (default: the first available of {', '.join(AUTO_ORDER)}), "
        f"{', '.join(BUILTIN)}, or an external backend as pkg.module:factory; repeatable",
    )
    parser.add_argument("--policy", default=None, help="tolerance policy (default: 'default')")
    parser.add_argument("--golden-dir", default=None, help="golden store (default $MLA_GOLDEN_DIR or .golden/)")
    parser.add_argument(
        "--run-name", default=None, help="report folder name under reports/out/ in the working directory"
    )
    parser.add_argument("--report-dir", default=None, help="report folder (overrides --run-name)")
    parser.add_argument("-n", "--jobs", default="auto", help="xdist workers (default auto: one per accelerator)")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="spread the run over a Ray cluster, one pytest shard per NPU/GPU/CPU slot (auto, HOST:PORT, "
        "ray://HOST:10001; none: $RAY_ADDRESS or a local cluster); needs the 'ray' extra; docs/cluster.md",
    )
    parser.add_argument(
        "--ray-retries",
        type=int,
        default=2,
        metavar="N",
        help="with --ray: times a shard whose worker or node died is run again (default 2)",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="finish the interrupted or killed run in DIR: only its selected tests without a record run, "
        "with its own arguments, into the same run (refused when the environment or goldens differ)",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments after --")
    parser.set_defaults(func="mlaconf.tools.run:run")


def _ascend(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ascend",
        help="on an Ascend box: build, probe, regen, smoke on every NPU backend, diffs, one archive",
        description="The one command to run on an Ascend A2/A3 machine: build the extension and check its "
        "ABI header, probe chip, ATB/CANN release and driver, regenerate the smoke goldens, run smoke on every "
        "available NPU backend (atb, ring-mla, npu-fia) and torch-cpu, diff ATB against each of them, and pack "
        f"the run directories, probe and environment into OUT.tar.gz. Exits {STOPPED_AT_PROBE} when a build "
        "requirement is missing (one line says what to install) or no NPU backend can run (the probe says why), "
        "else non-zero when a step or a smoke run failed.",
    )
    parser.add_argument("--out", default=f"ascend-{time.strftime('%Y%m%d-%H%M%S')}", help="output directory")
    parser.add_argument("--golden-dir", default=None, help="golden store (default OUT/golden)")
    parser.add_argument("-n", "--jobs", default="auto", help="xdist workers per smoke run (default auto)")
    parser.add_argument("--no-build", action="store_true", help="skip building the extension")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run only the probe")
    parser.set_defaults(func="mlaconf.tools.ascend:ascend")


def _import_dump(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "import-dump",
        help="turn the MLA prefill calls of an msprobe dump into a suite file with their exact inputs",
        description="Read an msprobe PyTorch dump (task tensor: step/rank folders, dump.json, dump_tensor_data), "
        "bind each MLA prefill call (npu_ring_mla, npu_fused_infer_attention_score, npu_fusion_attention, "
        "SDPA with 192/128 heads) to its op's signature, store its input tensors by content hash in the golden "
        "store's inputs/ folder and write a suite file; run it with `mlaconf run -- --mla-cases FILE`.",
    )
    parser.add_argument("dump_dir", type=Path, metavar="DUMP_DIR", help="the msprobe dump folder (its dump_path)")
    parser.add_argument("--out", type=Path, default=None, help="the suite file to write (default: stdout)")
    parser.add_argument("--suite", default="imported", help="the suite's name (default: imported)")
    parser.add_argument(
        "--golden-dir",
        type=Path,
        default=None,
        help="golden store for the input bundles (default $MLA_GOLDEN_DIR, else .golden)",
    )
    parser.add_argument(
        "--judge",
        action="store_true",
        help="also build each case's golden and judge its dumped device output like a backend's, with msprobe's "
        "benchmark verdict beside ours (exit 1 when one fails)",
    )
    parser.add_argument("--policy", default="default", help="the policy --judge decides by (default: 'default')")
    parser.set_defaults(func="mlaconf.tools.import_dump:run_import_dump")


def _power(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "power",
        help="run every planted defect and correct zoo member over a suite: kills, survivors, false-alarm margin",
        description="Run every catalogued defect and every zoo member (correct kernels on other rounding paths) "
        "through a suite's conformance cases, judged in-process with the default policy, goldens from the store. "
        "A defect a suite never fails survives: the report names the condition no case has and suggests shipped "
        "cases that kill it. Without --defects or --zoo both run; --defects alone runs those defects, --zoo alone "
        "the zoo. Exit 1 on a survivor or a false alarm, 130 when stopped (the report says it is partial).",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--suite", action="append", metavar="S", help="a shipped suite (repeatable; default smoke)")
    source.add_argument("--cases", type=Path, metavar="FILE", help="a suite file of your own (TOML)")
    parser.add_argument("--defects", nargs="+", metavar="NAME", help="only these defects (default: all)")
    parser.add_argument("--zoo", action="store_true", help="run the zoo (default: when --defects is not given)")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="cases run at once on N threads")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR", help=f"report folder ({DEFAULT_OUT})")
    parser.add_argument("--golden-dir", metavar="DIR", help="golden store (default $MLA_GOLDEN_DIR, else .golden)")
    parser.add_argument("--no-suggest", action="store_true", help="do not try shipped cases on the survivors")
    parser.set_defaults(func="mlaconf.tools.power_report:run_power")


def _coverage(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "coverage",
        help="t-way coverage of the factor model by suites, and what no case covers",
        description="For each selection (a suite or a --cases file), the share of the factor model's valid "
        "tuples of levels (facts/factors.toml) some case holds, for t = 1 .. --t, and the kernel-structure "
        "triples; then the uncovered tuples in words ('no case with group 6 and mask causal'). With --backend, "
        "only the cases that backend runs to a numeric verdict count (no known deviation for it refuses or fails "
        "them, judge/known_deviations.toml, at any release an entry names).",
    )
    p.add_argument("suites", nargs="*", metavar="SUITE", help="suite names or 'all' (default: smoke)")
    p.add_argument("--cases", action="append", default=[], metavar="FILE", help="a TOML suite file")
    p.add_argument("--t", type=int, default=3, choices=(1, 2, 3), help="highest strength t (default 3)")
    p.add_argument(
        "--show",
        type=int,
        default=DEFAULT_SHOW,
        metavar="N",
        help=f"uncovered tuples per t (default {DEFAULT_SHOW}; 0: all)",
    )
    p.add_argument(
        "--backend",
        default=None,
        metavar="NAME",
        help="count only the cases NAME (a built-in backend or pkg.module:factory) answers numerically",
    )
    p.add_argument(
        "--complete",
        action="store_true",
        help="with --backend: the cases NAME answers that hold the pairs (at --t 3 also the structure triples) "
        "its cases leave open, as [[case]] tables, and the tuples no such case holds",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func="mlaconf.tools.coverage_report:cmd_coverage")


def register(subparsers: Any) -> None:
    """The tools' verbs, in ``mlaconf --help``'s order."""
    for add in (_run, _shrink_repro, _ascend, _import_dump, _power, _coverage):
        add(subparsers)
