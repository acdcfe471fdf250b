"""Ray is optional: the local paths never import it, and ``--ray`` without it is one usage line naming
the extra (checked in a subprocess where ``import ray`` fails, whether or not Ray is installed here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.machine import HANG_S

REPO = Path(__file__).resolve().parents[2]
WITHOUT_RAY = "import sys; sys.modules['ray'] = None\nfrom mlaconf import main\nsys.exit(main(sys.argv[1:]))\n"
LOCAL_PATH = """
import sys
from pathlib import Path
from mlaconf import build_parser
from mlaconf.golden import maintain
from mlaconf.golden.building import regen
from mlaconf.golden.building import ray_regen
from mlaconf.runner import plugin
from mlaconf.tools import run
from mlaconf.tools import ray_run
build_parser()
suite = Path(sys.argv[1]) / "suite.toml"
suite.write_text("[[case]]\\nq_seqlen = [4]\\nhead_num = 1\\n")
assert maintain.main(["regen", "--cases", str(suite), "--out", sys.argv[1] + "/store", "-j", "2"]) == 0
assert "ray" not in sys.modules, "the local path imported ray"
"""


@pytest.mark.parametrize("verb", [["regen", "smoke"], ["run"]])
def test_ray_flag_without_ray_is_one_usage_line(verb: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, *verb, "--ray"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG_S,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ray needs Ray" in lines[0] and "[ray]" in lines[0], done.stderr
    assert not list(tmp_path.iterdir()), "nothing may be written"


def test_the_local_paths_never_import_ray(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_PATH, str(tmp_path)], capture_output=True, text=True, timeout=HANG_S
    )
    assert done.returncode == 0, done.stderr[-3000:]


# -- the sizing and slot rules, without a cluster ---------------------------------------------------

GB = 1024**3


def test_a_case_asks_for_the_cpus_whose_memory_covers_its_peak() -> None:
    from mlaconf.golden.building import cost
    from mlaconf.golden.building.ray_regen import ClusterShape
    from mlaconf.golden.specs.spec_build import build_case

    small = build_case({"q_seqlen": [4], "head_num": 1}, source="t")
    big = build_case({"q_seqlen": [4096], "head_num": 16}, source="t")
    shape = ClusterShape.of([{"CPU": 4.0, "memory": 4.0 * GB}, {"CPU": 16.0, "memory": 8.0 * GB}, {"memory": 1.0}])
    assert shape.memory_per_cpu == 0.5 * GB and shape.largest_memory == 8 * GB and shape.largest_cpus == 16
    assert shape.size(small) == (1, cost.peak_bytes(small, 1))
    cpus, memory = shape.size(big)
    assert cpus == -(-cost.peak_bytes(big, 1) // (GB // 2)) > 1 and memory == cost.peak_bytes(big, cpus)
    between = (cost.peak_bytes(small) + cost.peak_bytes(big)) / 2
    tight = ClusterShape.of([{"CPU": 2.0, "memory": between}])
    assert tight.size(big)[0] == 2  # never more CPUs than the largest node has
    assert list(cost.check_fit([small, big], memory=tight.largest_memory, disk=10 * GB).refused) == [big.case_id]
    with pytest.raises(ValueError, match="no node with CPUs and memory"):
        ClusterShape.of([{"GPU": 1.0}])


def test_shards_go_to_npus_then_gpus_then_cpus() -> None:
    from mlaconf.tools.ray_run import Slots

    mixed = [{"CPU": 64.0, "GPU": 2.0, "NPU": 8.0}, {"CPU": 32.0, "NPU": 8.0}]
    assert Slots.of(mixed) == Slots("NPU", 16) and Slots.of(mixed).options() == {"num_cpus": 1, "resources": {"NPU": 1}}
    assert Slots.of([{"CPU": 8.0, "GPU": 2.0}]).options() == {"num_cpus": 1, "num_gpus": 1}
    assert Slots.of([{"CPU": 3.0}]) == Slots("CPU", 3)
    with pytest.raises(ValueError, match="no NPU, GPU or CPU"):
        Slots.of([{"memory": 1.0}])


def test_a_shard_runs_pytest_alone_into_its_own_report_dir() -> None:
    from mlaconf import build_parser
    from mlaconf.tools.ray_run import plugin_arguments

    argv = ["run", "--ray", "--backend", "torch-cpu", "--golden-dir", "rel/store", "--run-name", "x", "-n", "4"]
    args = build_parser().parse_args([*argv, "--", "-k", "causal"])
    shard = plugin_arguments(args)
    assert shard[:4] == ["-p", "no:cacheprovider", "-n", "0"]  # no cache dir of the driver's, no xdist
    assert shard[shard.index("--mla-golden-dir") + 1] == str((Path.cwd() / "rel/store").resolve())
    assert "--mla-run-name" not in shard and "--mla-report-dir" not in shard
    assert shard[-2:] == ["-k", "causal"] and shard[shard.index("--mla-backend") + 1] == "torch-cpu"
