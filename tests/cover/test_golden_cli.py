"""The golden CLI verbs in-process: regen (incremental, repair, stale), verify (--recompute), show, list."""

from __future__ import annotations

import argparse
import dataclasses
import io
import re
from pathlib import Path

import h5py
import pytest

from mlaconf.golden import maintain, verbs
from mlaconf.golden.building import baseline
from mlaconf.golden.building.progress import Progress
from mlaconf.golden.specs.suites import load_suite
from mlaconf.golden.store.directory import GoldenStore
from tests.goldens import consistent, reseal, split_sum_gemm

SUITE = """
[suite]
name = "tiny"

[defaults]
head_num = 2

[[matrix]]
dtype = ["fp16", "bf16"]
mask_type = [0, 2]
q_seqlen = [[3, 0, 5], [9]]

[[case]]
q_seqlen = [4]
kv_seqlen = [9]
head_num = 4
kv_head_num = 2
mask_type = 3
kv_layout = "padded"
dtype = "bf16"

[[case]]
q_seqlen = [4]
head_num = 2
cache_mode = 0
expect_error = "ERROR_INVALID_PARAM"
"""
N_CASES = 9  # 8 matrix cases + the causal case; the error case is never computed


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(SUITE)
    return path


def flip_byte(path: Path, dataset: str) -> None:
    """Invert one byte of a dataset's raw data in place (contiguous layout: the offset is known)."""
    with h5py.File(path, "r", locking=False) as f:
        offset = f[dataset].id.get_offset() + f[dataset].id.get_storage_size() // 2
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0xFF]))


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    rc = maintain.main([str(a) for a in argv])
    return rc, capsys.readouterr().out


def test_register_adds_the_four_verbs() -> None:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb"))
    for verb, extra in (("regen", []), ("verify", []), ("list", []), ("show", ["abc"]), ("store", [])):
        args = parser.parse_args([verb, *extra])
        assert args.func == f"mlaconf.golden.maintain:cmd_{verb}" and callable(getattr(maintain, f"cmd_{verb}"))


def test_regen_is_incremental(capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path) -> None:
    out = tmp_path / "store"
    rc, text = run(capsys, "regen", "--cases", suite, "--out", out)
    assert rc == 0 and f"{N_CASES} generated, 0 up-to-date, 0 failed, 1 skipped" in text
    assert len(list(out.glob("*.h5"))) == N_CASES
    rc, text = run(capsys, "regen", "--cases", suite, "--out", out)
    assert rc == 0 and f"0 generated, {N_CASES} up-to-date" in text
    rc, text = run(capsys, "regen", "--cases", suite, "--out", out, "--force")
    assert rc == 0 and f"{N_CASES} generated" in text


def test_regen_repairs_corrupt_truncated_and_stale_files(
    capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path
) -> None:
    out = tmp_path / "store"
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    files = sorted(out.glob("*.h5"))
    flip_byte(files[0], "inputs/k")
    files[1].write_bytes(files[1].read_bytes()[:1000])
    for path in files[2:4]:
        with h5py.File(path, "r+", locking=False) as f:
            f.attrs["generator_version"] = "0.0-old"
    reseal(files[3])  # an old file, intact: stale, not corrupt
    files[4].write_bytes(files[4].read_bytes().replace(b"MLA-GOLDEN-HDF5", b"MLA-GOLDEN-HDF6", 1))
    rc, text = run(capsys, "verify", "--out", out)
    assert rc == 1
    assert f"{files[0]}: dataset 'inputs/k': GoldenCorruptError: raw data changed" in text
    assert f"{files[1]}: GoldenCorruptError: truncated: 1000 bytes" in text
    assert f"{files[2]}: GoldenCorruptError: " in text  # the attribute edit changed the file's size
    assert f"{files[3]}: GoldenStaleError: generator_version '0.0-old'" in text
    assert f"{files[4]}: GoldenCorruptError: integrity header damaged or absent" in text
    assert f"verify: {N_CASES - 5} ok, 5 bad" in text
    rc, text = run(capsys, "regen", "--cases", suite, "--out", out)
    assert rc == 0 and f"5 generated, {N_CASES - 5} up-to-date" in text
    rc, text = run(capsys, "verify", "--cases", suite, "--out", out)
    assert rc == 0 and f"verify: {N_CASES} ok, 0 bad" in text


def test_verify_recompute_catches_reference_drift(
    capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path
) -> None:
    out = tmp_path / "store"
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    rc, text = run(capsys, "verify", "--out", out, "--recompute")
    assert rc == 0 and f"verify: {N_CASES} ok" in text
    store = GoldenStore(out)
    spec = next(s for s in load_suite(suite) if s.dtype == "bf16" and s.mask_type == 2)
    golden = store.load(spec)
    store.save(dataclasses.replace(golden, out=golden.out * (1.0 + 1e-9)))  # valid checksums
    rc, text = run(capsys, "verify", "--out", out)
    assert rc == 0, "checksums alone cannot see the drift"
    rc, text = run(capsys, "verify", "--cases", suite, "--out", out, "--recompute")
    assert rc == 1
    assert f"{store.path_for(spec)}: dataset 'golden/out': reference drift: " in text
    assert re.search(r"[0-9]+ elements moved, largest [0-9.e-]+ of \|g\|\+A \(limit 1e-12\)", text)
    assert f"verify: {N_CASES - 1} ok, 1 bad" in text


def test_verify_recompute_on_another_blas_path_is_ok_and_says_what_moved(
    capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline's float32 GEMMs summed in another order (as MKL_CBWR=COMPATIBLE or another CPU
    would): exit 0, each moved file named with the size of its move; a stored baseline moved beyond its
    rounding bound is still bad."""
    out = tmp_path / "store"
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    monkeypatch.setattr(baseline, "gemm", split_sum_gemm)
    rc, text = run(capsys, "verify", "--out", out, "--recompute")
    assert rc == 0, text
    moved = re.findall(r"^ok \(baseline moved within its bound\) (\S+): ([0-9]+) of", text, re.MULTILINE)
    assert moved and all(int(count) > 0 for _, count in moved)
    assert f"verify: {N_CASES} ok ({len(moved)} moved within their bounds), 0 bad" in text
    store = GoldenStore(out)
    spec = next(s for s in load_suite(suite) if s.dtype == "bf16" and s.mask_type == 3)
    golden = store.load(spec)
    scaled = (golden.baseline_out.astype(float) * 1.5).astype(golden.baseline_out.dtype)
    store.save(consistent(golden, baseline_out=scaled))
    rc, text = run(capsys, "verify", "--out", out, "--recompute")
    assert rc == 1
    assert f"{store.path_for(spec)}: dataset 'baseline/out': baseline drift beyond its rounding bound" in text


def test_verify_names_missing_files_of_selected_cases(
    capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path
) -> None:
    rc, text = run(capsys, "verify", "--cases", suite, "--out", tmp_path / "empty")
    assert rc == 1 and text.count("GoldenMissingError: no golden file") == N_CASES
    assert run(capsys, "verify", "--out", tmp_path / "empty")[0] == 1, "an empty store is not a pass"


def test_show_finds_by_prefix_and_hash(capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path) -> None:
    out = tmp_path / "store"
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    spec = next(s for s in load_suite(suite) if s.mask_type == 3)
    for query in (spec.case_id, spec.case_id[:14], spec.content_hash[:10], spec.short_hash[:5]):
        rc, text = run(capsys, "show", query, "--out", out)
        assert rc == 0, query
        assert f"case: {spec.case_id}" in text and "checksums ok" in text
        assert "inputs/k           bf16     [1, 9, 256]" in text
        assert "row_valid: 4 of 4 rows" in text and "max_abs_err = " in text
        assert "generator_version = " in text and "builder.numpy = " in text and "builder.hdf5 = " in text
    assert run(capsys, "show", "fp16", "--out", out)[0] == 2  # ambiguous
    assert run(capsys, "show", "nothing-like-this", "--out", out)[0] == 2


def test_list_reports_golden_state(capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path) -> None:
    out = tmp_path / "store"
    rc, text = run(capsys, "list", "--cases", suite, "--out", out)
    assert rc == 0 and text.count("  missing: no golden file") == N_CASES and "error-case" in text
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    next(out.glob("*.h5")).write_bytes(b"garbage")
    rc, text = run(capsys, "list", "--cases", suite, "--out", out)
    assert text.count("  ok\n") == N_CASES - 1 and text.count("  corrupt: integrity header damaged") == 1
    assert "q[4, 4, 128] kv[1, 9, 256]" in text


def test_env_var_selects_the_store(
    capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLA_GOLDEN_DIR", str(tmp_path / "from-env"))
    assert run(capsys, "regen", "--cases", suite, "--shard", "1/2")[0] == 0
    written = len(list((tmp_path / "from-env").glob("*.h5")))
    assert run(capsys, "regen", "--cases", suite, "--shard", "2/2")[0] == 0
    assert 0 < written < N_CASES and len(list((tmp_path / "from-env").glob("*.h5"))) == N_CASES


def test_bad_selection_fails_cleanly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[suite]\nname = "bad"\n[[case]]\nq_seqlen = [4]\nhead_num = 0\n')
    rc = maintain.main(["regen", "--cases", str(bad), "--out", str(tmp_path)])
    assert rc == 2 and "'head_num'" in capsys.readouterr().err


@pytest.mark.parametrize(("total", "lines"), [(5, 5), (100, 20), (7, 7)])
def test_progress_prints_per_item_or_per_five_percent(total: int, lines: int) -> None:
    stream = io.StringIO()
    progress = Progress(total, "regen", stream)
    for _ in range(total):
        progress.advance("case")
    progress.close()
    text = stream.getvalue().splitlines()
    assert len(text) == lines and text[-1].startswith(f"regen {total}/{total} (100%)")


def test_progress_by_work_counts_flops_and_running_cases() -> None:
    stream = io.StringIO()
    progress = Progress(2, "regen", stream, work=4e9)
    progress.partial(1e9, "[a: reference 50%]")  # a log gets a line only every LOG_INTERVAL
    progress.advance("a", work=2e9)
    progress.advance("b", work=2e9)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("regen 1/2 (50% of 4.0 GFLOP)") and "GF/s" in lines[0]
    assert lines[-1].startswith("regen 2/2 (100% of 4.0 GFLOP)")


@pytest.mark.parametrize("mask_type", [0, 2, 3])
def test_build_reports_work_inside_a_case(mask_type: int) -> None:
    """Every reference and baseline tile reports its useful FLOPs: a build ends at exactly 100 %."""
    from mlaconf.golden.building import progress
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.specs.spec_build import build_case

    fields: dict[str, object] = {"q_seqlen": [300, 0, 40], "head_num": 2, "mask_type": mask_type}
    if mask_type == 3:
        fields.update(kv_seqlen=[700, 3, 40], kv_layout="padded")
    spec = build_case(fields, source="test")
    seen: list[tuple[str, float, bool]] = []
    lines: list[str] = []
    announce = progress.Announcer(lines.append, after=0.0, every=0.0)
    remove = progress.add_listener(lambda w: seen.append((w.stage, w.fraction, w.finished)))
    remove_announcer = progress.add_listener(announce)
    try:
        build_golden(spec, threads=2)
    finally:
        remove()
        remove_announcer()
    stages = list(dict.fromkeys(stage for stage, _, _ in seen))
    assert stages == ["inputs", "reference + magnitudes", "baseline", "statistics"]
    assert seen[-1] == ("statistics", 1.0, True)
    assert lines[-1].startswith(f"golden: generated {spec.case_id} in ")
    assert "useful" in lines[0]


def test_list_announces_cost(capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path) -> None:
    from mlaconf.golden.building import cost

    out = tmp_path / "store"
    rc, text = run(capsys, "list", "--cases", suite, "--out", out)
    assert rc == 0 and "FLOP  ~" in text and "peak ~" in text
    assert text.splitlines()[-1].startswith(f"total: {N_CASES + 1} cases, ")
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    for spec in load_suite(suite):
        if spec.expect_error is None:  # the estimate is the file's size up to the fixed metadata allowance
            actual = (out / f"{spec.case_id}.h5").stat().st_size
            assert cost.stored_bytes(spec) - cost.FILE_OVERHEAD <= actual <= cost.stored_bytes(spec), spec.case_id


def test_store_shows_suites_and_prunes_only_with_yes(
    capsys: pytest.CaptureFixture[str], suite: Path, tmp_path: Path
) -> None:
    out = tmp_path / "store"
    assert run(capsys, "regen", "--cases", suite, "--out", out)[0] == 0
    orphan = out / "fp16-undefined-old-case-0000aaaa.h5"
    orphan.write_bytes(b"x" * 10)
    rc, text = run(capsys, "store", "--out", out, "--cases", suite)
    assert rc == 0 and f"{N_CASES:7d}     0" in text and "unreferenced: 1 files" in text
    rc, text = run(capsys, "store", "--out", out, "--cases", suite, "--prune")
    assert "would delete fp16-undefined-old-case-0000aaaa.h5" in text and orphan.exists()
    rc, text = run(capsys, "store", "--out", out, "--cases", suite, "--prune", "--yes")
    assert "delete fp16-undefined-old-case-0000aaaa.h5" in text and not orphan.exists()
    assert len(list(out.glob("*.h5"))) == N_CASES  # referenced files stay


def test_regen_in_worker_processes_reports_work(suite: Path, tmp_path: Path) -> None:
    """--jobs 2: workers send in-case progress through a queue; the line counts FLOPs, not cases."""
    from mlaconf.golden.building import regen as rg

    stream = io.StringIO()
    specs = rg.select_cases([], [suite])
    summary = rg.regen(specs, GoldenStore(tmp_path / "store"), jobs=2, stream=stream)
    assert summary.count("generated") == N_CASES and summary.count("failed") == 0
    lines = stream.getvalue().splitlines()
    assert lines[-1].startswith(f"regen {N_CASES}/{N_CASES} (100% of ") and " FLOP) " in lines[-1]
