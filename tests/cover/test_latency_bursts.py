"""Latency that a shared host cannot fool: a rerun whose cases met bursts of load flags nothing, a
planted 2x slowdown is flagged, a host slower throughout is said once, and every note's wording
matches its number (synthetic timing records; the calibration is the one the runner times)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from mlaconf.harness.backend import BackendInfo
from mlaconf.reports import diff, records
from mlaconf.runner.execution import Execution, calibration_ms, execute
from tests.runs import record

CALLS = 12
KERNEL_MS = 1.5
CALIBRATION = 0.3


def timed(
    case: str, rng: random.Random, *, kernel: float = 1.0, host: float = 1.0, burst: float = 1.0
) -> dict[str, Any]:
    """A case's record: ``CALLS`` calls, each with the calibration timed before it; ``kernel``
    slows the kernel only, ``host`` every call and calibration (a slower host), ``burst`` both
    during this case alone (load that came and went)."""
    calls, calibration = [], []
    for _ in range(CALLS):
        moment = host * burst * rng.uniform(0.9, 1.15)  # the host's speed at this call's moment
        calibration.append(round(CALIBRATION * moment * rng.uniform(0.97, 1.03), 4))
        calls.append(round(KERNEL_MS * kernel * moment * rng.uniform(0.97, 1.03), 4))
    timing = {"latencies_ms": calls, "calibration_ms": calibration, "repeats": CALLS}
    return record(case, backend="torch-cpu", timing=timing)


def uncalibrated(r: dict[str, Any]) -> dict[str, Any]:
    """The record as runs before the calibration wrote it."""
    return r | {"timing": {k: v for k, v in r["timing"].items() if k != "calibration_ms"}}


def rerun(n: int = 40, **planted: dict[str, float]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(43)
    base = [timed(f"c{k}", rng) for k in range(n)]
    cand = [timed(f"c{k}", rng, **planted.get(f"c{k}", {})) for k in range(n)]
    return base, cand


#: A no-change rerun on a shared host: a quarter of the cases ran inside a burst, 3x to 12x slower.
BURSTS = {f"c{k}": {"burst": 3.0 + (k % 5) * 2.25} for k in range(0, 40, 4)}


def test_a_rerun_under_load_bursts_flags_nothing() -> None:
    base, cand = rerun(**BURSTS)
    cases, perf = diff.diff_records(base, cand)
    assert perf == [], [(p.case_id, p.ratio) for p in perf]
    burst = next(c for c in cases if c.case_id == "c0")
    assert burst.latency.startswith("unchanged") and "each over its calibration" in burst.latency
    assert "noise" in burst.latency  # what was compared and the noise seen
    # the same records without their calibration cannot tell a burst from a slowdown: that is what
    # the runs before it reported (the 12.4x and 2.7x on an identical rerun)
    _, raw = diff.diff_records([uncalibrated(r) for r in base], [uncalibrated(r) for r in cand])
    assert {p.case_id for p in raw} & set(BURSTS)


def test_a_planted_2x_slowdown_is_flagged_among_bursts() -> None:
    base, cand = rerun(**BURSTS, c7={"kernel": 2.0})
    _, perf = diff.diff_records(base, cand)
    assert [p.case_id for p in perf] == ["c7"]
    assert perf[0].ratio == pytest.approx(2.0, rel=0.1) and "each over its calibration" in perf[0].basis


def test_a_host_slower_throughout_is_said_once_not_case_by_case(tmp_path: Any) -> None:
    from tests.runs import write_run_dir

    base, cand = rerun(**{f"c{k}": {"host": 1.8} for k in range(40)})
    a = write_run_dir(tmp_path / "a", base, run_id="a")
    b = write_run_dir(tmp_path / "b", cand, run_id="b")
    result = diff.diff_dirs(a, b)
    assert result.perf == []
    (said,) = [n for n in result.notes if "slower throughout" in n]
    ratio = float(said.split("ran ")[1].split("x")[0])
    assert ratio == pytest.approx(1.8, rel=0.05), said  # the words and the number agree
    # runs from before the calibration: the common ratio is the run's, and a case 2x beyond it still shows
    old_base = [uncalibrated(r) for r in base]
    old_cand = [uncalibrated(r) for r in cand]
    old_cand[5] = uncalibrated(timed("c5", random.Random(5), host=1.8, kernel=2.0))
    a = write_run_dir(tmp_path / "oa", old_base, run_id="oa")
    b = write_run_dir(tmp_path / "ob", old_cand, run_id="ob")
    result = diff.diff_dirs(a, b)
    assert [p.case_id for p in result.perf] == ["c5"]
    (said,) = [n for n in result.notes if "slower throughout" in n]
    ratio = float(said.split("median fastest-call ratio ")[1].split("x")[0])
    assert ratio == pytest.approx(1.8, rel=0.05) and "no calibration tells which" in said, said


def test_a_note_says_what_its_number_says(tmp_path: Any) -> None:
    from tests.runs import write_run_dir

    base, cand = rerun()
    result = diff.diff_dirs(
        write_run_dir(tmp_path / "a", base, run_id="a"), write_run_dir(tmp_path / "b", cand, run_id="b")
    )
    notes = " | ".join(result.notes)
    assert "far from 1" not in notes and "slower throughout" not in notes
    assert "within 1.2x, the hosts ran alike" in notes and "noise seen" in notes


def test_the_runner_times_the_calibration_beside_every_call() -> None:
    assert 0 < calibration_ms() < 1000
    timing = Execution(out=None, latencies_ms=[1.0, 1.1], flops=10**9, calibration_ms=[0.3, 0.31]).timing()  # type: ignore[arg-type]
    assert timing["calibration_ms"] == [0.3, 0.31]
    assert "calibration_ms" not in Execution(out=None, latencies_ms=[1.0], flops=1).timing()  # type: ignore[arg-type]
    # the record schema carries it, and refuses a calibration that is not a time
    good = record("c", timing={"latencies_ms": [1.0], "calibration_ms": [0.3]})
    assert records.ResultRecord.from_dict(good).timing == good["timing"]
    with pytest.raises(records.RecordError, match="calibration_ms"):
        records.ResultRecord.from_dict(record("c", timing={"latencies_ms": [1.0], "calibration_ms": [math.nan]}))


def test_a_kernel_2x_slower_everywhere_is_flagged_across_the_board(tmp_path: Any) -> None:
    """On a loaded host a 2x slowdown can drown case by case; the median over the pairs, over the
    host calibration's, does not (measured: 2.04x over 70 pairs at load 13, docs/reports.md)."""
    from tests.runs import write_run_dir

    slow = {f"c{k}": {"kernel": 2.0, **BURSTS.get(f"c{k}", {})} for k in range(40)}
    base, cand = rerun(**slow)
    result = diff.diff_dirs(
        write_run_dir(tmp_path / "a", base, run_id="a"), write_run_dir(tmp_path / "b", cand, run_id="b")
    )
    assert "kernels are slower across the board" in result.perf_across
    ratio = float(result.perf_across.rsplit(", ", 1)[1].split("x")[0])
    assert ratio == pytest.approx(2.0, rel=0.1), result.perf_across
    assert result.exit_status(fail_on_perf=True) == 1 and result.exit_status(fail_on_perf=False) == 0
    # a host slower throughout moves the calibration too: nothing across the board
    base, cand = rerun(**{f"c{k}": {"host": 1.8} for k in range(40)})
    result = diff.diff_dirs(
        write_run_dir(tmp_path / "c", base, run_id="c"), write_run_dir(tmp_path / "d", cand, run_id="d")
    )
    assert result.perf_across == "" and result.exit_status(fail_on_perf=True) == 0


class _StubKernel:
    """A backend whose calls cost nothing: only the device it reports matters here."""

    name = "stub"

    def __init__(self, device: str) -> None:
        self.device = device

    def info(self) -> BackendInfo:
        return BackendInfo(self.name, self.device)

    def synchronize(self) -> None:
        pass

    def run(self, call: object) -> torch.Tensor:
        return torch.zeros(2)


@pytest.mark.parametrize(("device", "calibrated"), [("cpu", True), ("npu:0 (Ascend910B3)", False), ("cuda:0", False)])
def test_only_a_cpu_kernel_is_calibrated_by_the_cpu(device: str, calibrated: bool) -> None:
    """A device kernel does not slow with the host's CPU load: dividing its latency by a CPU matmul's would
    hide its own slowdown on a busier host."""
    spec = SimpleNamespace(useful_flops=1, case_id="stub")
    done = execute(_StubKernel(device), cast(Any, None), cast(Any, spec), repeats=3)
    assert len(done.latencies_ms) == 3
    assert len(done.calibration_ms) == (3 if calibrated else 0)


def replayed(calls: list[float], calibration: list[float]) -> dict[str, Any]:
    timing = {"latencies_ms": calls, "calibration_ms": calibration, "repeats": len(calls)}
    return record("c", backend="torch-cpu", timing=timing)


def test_a_no_change_rerun_whose_bursts_hit_calibrations_or_calls_flags_nothing() -> None:
    """The false alarm of two timed runs of one venv: three of the base's short calibrations met a burst (its
    calls did not: their fastest quarter over calibration was exactly those three, 37.92x on the old rule),
    and half the candidate's calls met one (its median 87 -> 136 ms).  Burst-hit calibrations are set aside
    and a run whose calls spread that widely is said to be noisy, never a slowdown."""
    rng = random.Random(7)
    jitter = [rng.uniform(0.98, 1.02) for _ in range(24)]
    base_calls = [round(87.0 * j, 3) for j in jitter[:12]]
    base_cal = [4.1, 3.8, 4.4] + [round(0.4 * j, 4) for j in jitter[12:21]]
    cand_calls = [round(87.0 * j, 3) for j in jitter[12:18]] + [round(185.0 * j, 3) for j in jitter[18:24]]
    cand_cal = [round(0.4 * j, 4) for j in jitter[:12]]
    cases, perf = diff.diff_records([replayed(base_calls, base_cal)], [replayed(cand_calls, cand_cal)])
    assert perf == [], [(p.case_id, p.ratio) for p in perf]
    assert cases[0].latency.startswith("not compared: host noisy (a case's calls deviate"), cases[0].latency
    # the base's bursts alone: set aside, and the pair compares unchanged
    cases, perf = diff.diff_records([replayed(base_calls, base_cal)], [replayed(base_calls, cand_cal)])
    assert perf == [] and cases[0].latency.startswith("unchanged ("), cases[0].latency
    # more than a quarter of a side's calibrations off their median: nothing to compare
    noisy_cal = [4.1, 3.8, 4.4, 5.0, *base_cal[4:]]
    cases, _ = diff.diff_records([replayed(base_calls, noisy_cal)], [replayed(base_calls, cand_cal)])
    assert cases[0].latency == (
        "not compared: host noisy (4 of 12 base and 0 of 12 candidate calibrations off their median by more than 1.5x)"
    )
