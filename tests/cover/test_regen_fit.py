"""Cases too large for this host are refused before any work: ``regen`` builds
nothing and exits 2, ``list`` marks them and exits 1, ``--allow-oversize`` forces them; a
selection that fits case by case but not at the requested parallelism or on the free disk is warned of."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlaconf.golden import maintain
from mlaconf.golden.building import cost
from mlaconf.golden.specs.spec_build import build_case

HUGE = "[[case]]\nq_seqlen = [1000000000]\nhead_num = 1\n"
SMALL = "[[case]]\nq_seqlen = [4]\nhead_num = 1\n[[case]]\nq_seqlen = [5]\nhead_num = 1\n"


def _suite(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def test_regen_refuses_a_case_larger_than_the_host_and_builds_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    suite, out = _suite(tmp_path, HUGE + SMALL), tmp_path / "store"
    huge = build_case({"q_seqlen": [1000000000], "head_num": 1}, source="t")
    assert maintain.main(["regen", "--cases", str(suite), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: case {huge.case_id}: estimated peak memory ~" in err
    assert "exceeds this host's" in err and "exceeds the store's free disk" in err
    assert "nothing was built (--allow-oversize forces them)" in err
    assert not out.exists() or not list(out.glob("*.h5"))


def test_list_marks_the_refused_case_and_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    suite = _suite(tmp_path, HUGE + SMALL)
    assert maintain.main(["list", "--cases", str(suite), "--out", str(tmp_path / "store")]) == 1
    captured = capsys.readouterr()
    refused = [line for line in captured.out.splitlines() if "REFUSED here" in line]
    assert len(refused) == 1 and "s1000000000" in refused[0]
    assert "1 case(s) too large to generate on this host" in captured.err
    assert maintain.main(["list", "--cases", str(_suite(tmp_path, SMALL)), "--out", str(tmp_path / "store")]) == 0


def test_allow_oversize_forces_a_refused_case(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose memory is below a small case's estimated peak: refused, then forced."""
    monkeypatch.setattr(cost, "host_memory_bytes", lambda: 50 * 1024 * 1024)
    suite, out = _suite(tmp_path, SMALL), tmp_path / "store"
    assert maintain.main(["regen", "--cases", str(suite), "--out", str(out)]) == 2
    assert "2 case(s) cannot be generated on this host" in capsys.readouterr().err
    assert not out.exists() or not list(out.glob("*.h5"))
    assert maintain.main(["regen", "--cases", str(suite), "--out", str(out), "--allow-oversize"]) == 0
    assert len(list(out.glob("*.h5"))) == 2
    # built elsewhere into a shared store: an oversize case whose file is current is not refused
    assert maintain.main(["regen", "--cases", str(suite), "--out", str(out)]) == 0
    assert "2 up-to-date" in capsys.readouterr().out


def test_parallelism_that_overruns_memory_is_reported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = build_case({"q_seqlen": [4], "head_num": 1}, source="t")
    memory = int(1.5 * cost.peak_bytes(small, threads=1))
    monkeypatch.setattr(cost, "host_memory_bytes", lambda: memory)
    monkeypatch.setattr(maintain.rg, "cpu_count", lambda: 2)
    suite = _suite(tmp_path, SMALL)
    assert maintain.main(["list", "--cases", str(suite), "--out", str(tmp_path / "store"), "-j", "2"]) == 0
    assert "list: warning: with 2 jobs the largest cases running together peak at" in capsys.readouterr().err
    assert maintain.main(["list", "--cases", str(suite), "--out", str(tmp_path / "store")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_check_fit_judges_memory_disk_and_their_totals() -> None:
    a = build_case({"q_seqlen": [64], "head_num": 2}, source="t")
    b = build_case({"q_seqlen": [32], "head_num": 2}, source="t")
    peak_a, size_a, size_b = cost.peak_bytes(a), cost.stored_bytes(a), cost.stored_bytes(b)
    plenty = 10 * (peak_a + size_a)
    assert cost.check_fit([a, b], memory=plenty, disk=plenty, jobs=2) == cost.Fit()
    assert set(cost.check_fit([a, b], memory=peak_a - 1, disk=plenty).refused) >= {a.case_id}
    by_disk = cost.check_fit([a, b], memory=plenty, disk=size_a - 1)
    assert list(by_disk.refused) == [a.case_id] and "free disk" in by_disk.refused[a.case_id]
    together = cost.check_fit([a, b], memory=plenty, disk=size_a + size_b - 1)
    assert not together.refused and any("together" in w for w in together.warnings)
    assert cost.host_memory_bytes() > 0 and cost.free_disk_bytes(Path("/nonexistent/dir")) > 0
