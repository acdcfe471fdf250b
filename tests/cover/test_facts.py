"""facts: the operator's single source of truth (shard rule, layouts, FLOPs, versions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlaconf.facts.operator import kv_layout_of, useful_flops
from mlaconf.facts.shard import in_shard, parse_shard, shard_index
from mlaconf.facts.versions import ascend_versions, atb_version_near
from mlaconf.golden.building.regen import select_cases
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest


@pytest.mark.parametrize("text", ["0/3", "4/3", "a/b", "1", "1-3", "1/0", "-1/2"])
def test_bad_shard_spec_names_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="shard"):
        parse_shard(text)


def test_shard_index_is_the_content_hash_modulo_and_stable() -> None:
    hashes = [f"{i:064x}" for i in range(30)]
    assert [shard_index(h, 3) for h in hashes] == [i % 3 for i in range(30)]
    assert shard_index("not-hex", 4) == shard_index("not-hex", 4)
    assert in_shard(hashes[4], (2, 3)) and not in_shard(hashes[4], (1, 3)) and in_shard(hashes[4], None)
    assert parse_shard("2/3") == (2, 3)


def test_pytest_shard_equals_regen_shard(tmp_path: Path) -> None:
    """A host's `mlaconf regen --mla-shard K/N` pre-builds exactly what its `pytest --mla-shard K/N` needs."""
    for k in (1, 4):
        expected = {spec.case_id for spec in select_cases(["smoke"], shard=(k, 4))}
        done = run_pytest(
            "cases/test_conformance.py",
            "--collect-only",
            "-q",
            "--mla-suite",
            "smoke",
            "--mla-backend",
            "torch-cpu",
            "--mla-shard",
            f"{k}/4",
            report=tmp_path / "r",
            inherit=True,
            timeout=HANG_S,
        )
        collected = {
            line.split("[", 1)[1].rsplit("-torch-cpu]", 1)[0]
            for line in done.stdout.splitlines()
            if "::test_conformance[" in line
        }
        assert expected, "the smoke suite has cases in every quarter"
        assert collected == expected, (k, sorted(collected ^ expected))


def test_kv_layout_prefers_packed_only_where_both_readings_agree() -> None:
    assert kv_layout_of((10, 2, 128), (4, 6), 2) == "packed"
    assert kv_layout_of((2, 6, 256), (4, 6), 2) == "padded"
    assert kv_layout_of((2, 1, 128), (1, 1), 1) == "packed"  # padded [2, 1, 128] reads the same rows
    assert kv_layout_of((2, 2, 128), (0, 2), 1) == "padded"  # Σkv = 2 but [2, 2, 128] is not [2, 1, 128]
    assert kv_layout_of((10, 256), (4, 6), 2) is None
    assert kv_layout_of((3, 6, 256), (4, 6), 2) is None


def test_useful_flops_counts_only_allowed_pairs() -> None:
    assert useful_flops(0, (4,), (4,), 2) == 2 * 320 * 16 * 2
    assert useful_flops(2, (4,), (4,), 1) == 2 * 320 * 10
    assert useful_flops(3, (2,), (5,), 1) == 2 * 320 * (4 + 5)
    assert useful_flops(0, (0, 3), (0, 3), 1) == 2 * 320 * 9
    # causal with a prefix (5 + 6 + 7 + 8 + 9 keys), an empty batch with keys, a square batch (1 + 2 + 3)
    assert useful_flops(3, (5, 0, 3), (9, 2, 3), 4) == 2 * 320 * (35 + 6) * 4


def test_ascend_versions_from_install_files(tmp_path: Path) -> None:
    (tmp_path / "ascend-toolkit/latest/x86_64-linux").mkdir(parents=True)
    (tmp_path / "ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.2.RC1\ninnerversion=V100R001C22\n"
    )
    (tmp_path / "nnal/atb/latest/atb/cxx_abi_0").mkdir(parents=True)
    (tmp_path / "nnal/atb/latest/version.info").write_text(
        "    Ascend-cann-atb : 8.2.RC1\n    Ascend-cann-atb Version : 8.2.RC1.B030\n    Platform : aarch64\n"
    )
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver/version.info").write_text("Version=24.1.rc2\nascendhal_version=7.35.23\n")
    atb_home = {"ATB_HOME_PATH": str(tmp_path / "nnal/atb/latest/atb/cxx_abi_0")}
    found = ascend_versions(tmp_path, atb_home)
    assert found["cann_toolkit"]["version"] == "8.2.RC1"
    assert found["atb"]["version"] == "8.2.RC1.B030"
    assert found["driver"]["version"] == "24.1.rc2"
    assert ascend_versions(tmp_path / "nowhere", {}) == {"cann_toolkit": None, "atb": None, "driver": None}


def test_atb_version_is_the_one_run_json_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Known deviations and run.json read the same file with the same parser."""
    monkeypatch.delenv("MLA_ATB_VERSION", raising=False)
    lib = tmp_path / "nnal/atb/latest/atb/cxx_abi_0/lib/libatb.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    (tmp_path / "nnal/atb/latest/version.info").write_text("Ascend-cann-atb Version : 8.3.RC1\n")
    assert atb_version_near(lib) == "8.3.RC1"
    env = {"ATB_HOME_PATH": str(tmp_path / "nnal/atb/latest/atb/cxx_abi_0")}
    assert ascend_versions(tmp_path, env)["atb"]["version"] == "8.3.RC1"
    monkeypatch.setenv("MLA_ATB_VERSION", "9.0.0")
    assert atb_version_near(lib) == "9.0.0"
    assert atb_version_near(tmp_path / "elsewhere/libatb.so") == "9.0.0"
    monkeypatch.delenv("MLA_ATB_VERSION")
    assert atb_version_near(tmp_path / "elsewhere/libatb.so") is None
