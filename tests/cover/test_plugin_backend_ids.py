"""A plug-in backend's test ids end with the backend's own name, not its import
path, and a test whose worker died is still traced to that backend from its id."""

from __future__ import annotations

from pathlib import Path

from mlaconf.runner.recording import identity_from_nodeid
from tests.cover.test_registry import EXTERNAL, MY_LIB, run_suite


def test_a_plugin_backends_ids_end_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "my_kernels.py").write_text(EXTERNAL)
    (tmp_path / "my_lib.py").write_text(MY_LIB)
    result = run_suite(tmp_path, "--mla-backend", "my_kernels:factory", "--collect-only", "-k", "fp16-undefined and b3")
    ids = [line for line in result.stdout.splitlines() if "::test_" in line]
    assert ids, result.stdout[-2000:] + result.stderr[-2000:]
    assert all(line.endswith("-my-kernel]") for line in ids), ids[:3]
    assert not any("my_kernels:factory" in line for line in ids)


def test_a_plugin_backends_id_maps_back_to_its_label() -> None:
    nodeid = "cases/test_conformance.py::test_conformance[fp16-b3-my-kernel]"
    ident = identity_from_nodeid(nodeid, {"my_kernels:factory": "my-kernel"})
    assert ident["backend"] == "my-kernel" and ident["case_id"] == "fp16-b3"
    builtin = identity_from_nodeid(
        "cases/test_conformance.py::test_conformance[c1-torch-cpu]", {"torch-cpu": "torch-cpu"}
    )
    assert builtin["backend"] == "torch-cpu" and builtin["case_id"] == "c1"
