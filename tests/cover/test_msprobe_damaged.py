"""import-dump on repeated and damaged dumps: calls of equal content become one case whose file loads, and a
damaged dump (its json, an entry, a tensor file) is one line naming the file or call, never a traceback or a
hang; tensor files are held to what dump.json declares of them."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mlaconf.__init__ import main
from mlaconf.golden.specs.suites import load_suite
from mlaconf.tools.msprobe_dump import import_dump

DATA = Path(__file__).resolve().parents[1] / "data" / "msprobe"
RING = "NPU.npu_ring_mla.0.forward"


@pytest.fixture
def npu_dump(tmp_path: Path) -> Path:
    """msprobe's own dump of the stand-in ring-mla and FIA calls: step0/proc<pid>/dump.json."""
    with tarfile.open(DATA / "npu.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path / "npu"


def dump_json(dump: Path) -> Path:
    return next(dump.rglob("dump.json"))


def edit_json(dump: Path, change: Callable[[dict[str, Any]], object]) -> None:
    path = dump_json(dump)
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_calls_of_equal_content_become_one_case_and_the_file_loads(
    npu_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same calls dumped in two steps: one case each, the later call named in its comment."""
    first = dump_json(npu_dump).parent
    shutil.copytree(first, npu_dump / "step1" / first.name)
    suite = tmp_path / "imported.toml"
    assert main(["import-dump", str(npu_dump), "--golden-dir", str(tmp_path / "store"), "--out", str(suite)]) == 0
    cases = load_suite(suite)  # before: "duplicates case ..." and the run refused the file
    assert [case.name.split("-", 2)[2] for case in cases] == [RING, "NPU.npu_fused_infer_attention_score.0.forward"]
    text = suite.read_text()
    assert f"the same content as step1/{first.name}/{RING})" in text
    assert "wrote 2 cases" in capsys.readouterr().err


def _data_not_object(document: dict[str, Any]) -> None:
    document["data"] = ["not", "an", "object"]


def _args_a_string(document: dict[str, Any]) -> None:
    document["data"][RING]["input_args"] = "q_nope"


def _kwargs_a_list(document: dict[str, Any]) -> None:
    document["data"][RING]["input_kwargs"] = [1, 2]


def _output_a_number(document: dict[str, Any]) -> None:
    document["data"][RING]["output"] = 7


def _deep_argument(document: dict[str, Any]) -> None:
    nested: object = 1
    for _ in range(50):
        nested = [nested]
    document["data"][RING]["input_kwargs"]["head_num"] = nested


def _long_data_name(document: dict[str, Any]) -> None:
    document["data"][RING]["input_kwargs"]["q_nope"]["data_name"] = "x" * 5000


def _data_name_climbs_out(document: dict[str, Any]) -> None:
    document["data"][RING]["input_kwargs"]["q_nope"]["data_name"] = "../../dump.json"


def _head_num_a_string(document: dict[str, Any]) -> None:
    document["data"][RING]["input_kwargs"]["head_num"] = {"type": "str", "value": "two"}


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        pytest.param(damage, said, id=damage.__name__.strip("_"))
        for damage, said in (
            (_data_not_object, "its data is a list, not an object"),
            (_args_a_string, f"{RING}: input_args is a str, not a list"),
            (_kwargs_a_list, f"{RING}: input_kwargs is a list, not a dict"),
            (_output_a_number, f"{RING}: output is a int, not a list"),
            (_deep_argument, f"{RING}: argument head_num is nested more than 8 deep"),
            (_long_data_name, f"{RING}: tensor q_nope: data_name 'xxxx"),
            (_data_name_climbs_out, f"{RING}: tensor q_nope: data_name '../../dump.json' is not a file name"),
            (_head_num_a_string, f"{RING}: malformed entry (ValueError"),
        )
    ],
)
def test_a_damaged_entry_is_one_line(
    npu_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[..., None], said: str
) -> None:
    edit_json(npu_dump, damage)
    status = main(["import-dump", str(npu_dump), "--golden-dir", str(tmp_path / "store"), "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert status in (0, 1, 2) and "Traceback" not in err
    lines = [line for line in err.splitlines() if said in line]
    assert len(lines) == 1, err


def test_json_nested_past_the_parsers_limit_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "dump.json").write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["import-dump", str(tmp_path / "dump")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dump.json: not an msprobe dump.json (RecursionError" in err


@pytest.mark.timeout(60)
def test_a_fifo_named_dump_json_is_refused_without_opening_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dump").mkdir()
    os.mkfifo(tmp_path / "dump" / "dump.json")
    assert main(["import-dump", str(tmp_path / "dump")]) == 2
    assert "dump.json: not a regular file" in capsys.readouterr().err


def _tensor_file(dump: Path, data_name: str) -> Path:
    return next(dump.rglob(data_name))


def test_a_tensor_file_unlike_its_declaration_is_refused(npu_dump: Path, tmp_path: Path) -> None:
    """One element of q_nope grown (as an exponent bit flip does): its Max no longer matches dump.json."""
    path = _tensor_file(npu_dump, f"{RING}.kwargs.q_nope.pt")
    tensor = torch.load(path, weights_only=True)
    flat = tensor.view(-1)
    flat[int(flat.abs().argmax())] *= 4
    torch.save(tensor, path)
    result = import_dump(npu_dump, tmp_path / "store")
    refused = [line for line in result.unrecoverable if f"{RING}: tensor q_nope:" in line]
    assert len(refused) == 1 and "does not match dump.json (Max" in refused[0], result.unrecoverable
    assert RING not in " ".join(case.name for case in result.cases)


def test_a_tensor_of_another_shape_or_dtype_is_refused(npu_dump: Path, tmp_path: Path) -> None:
    path = _tensor_file(npu_dump, f"{RING}.kwargs.value.pt")
    tensor = torch.load(path, weights_only=True)
    torch.save(tensor.half(), path)
    result = import_dump(npu_dump, tmp_path / "store")
    assert any(
        "tensor value:" in line and "holds torch.float16, dump.json declares" in line for line in result.unrecoverable
    )
    torch.save(tensor[:1], path)
    result = import_dump(npu_dump, tmp_path / "store")
    assert any("tensor value:" in line and "dump.json declares [6, 2, 128]" in line for line in result.unrecoverable)


def test_non_finite_inputs_are_named_and_not_imported(npu_dump: Path, tmp_path: Path) -> None:
    """A NaN in k_nope whose dump.json says so (msprobe states NaN statistics): the call is said, not a case."""
    path = _tensor_file(npu_dump, f"{RING}.kwargs.k_nope.pt")
    tensor = torch.load(path, weights_only=True)
    tensor.view(-1)[3] = float("nan")
    torch.save(tensor, path)

    def declare_nan(document: dict[str, Any]) -> None:
        for stat in ("Max", "Min", "Mean", "Norm"):
            document["data"][RING]["input_kwargs"]["k_nope"][stat] = float("nan")

    edit_json(npu_dump, declare_nan)
    result = import_dump(npu_dump, tmp_path / "store")
    assert any(f"{RING}: inputs k hold NaN or Inf" in line for line in result.unrecoverable), result.unrecoverable
    assert all(RING not in case.name for case in result.cases)


#: Values a fuzzed entry takes: every JSON kind, and the shapes msprobe's entries have.
FUZZ_VALUES: tuple[object, ...] = (
    None,
    "text",
    -1,
    2**70,
    1e308,
    True,
    [],
    {},
    [[[1]]],
    {"type": "torch.Tensor"},
    {"type": "torch.Tensor", "data_name": 3},
    {"type": "int", "value": "7"},
)


def _nodes(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _nodes(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nodes(item, (*path, index))
    return found


def test_fuzzed_dump_json_never_raises(npu_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Sixty seeded replacements of one node of dump.json by another kind of value: one line each, an exit
    status, never an exception out of the verb."""
    import random

    path = dump_json(npu_dump)
    pristine = json.loads(path.read_text())
    nodes = [node for node in _nodes(pristine) if node]
    generator = random.Random(20261206)
    for _ in range(60):
        document = json.loads(json.dumps(pristine))
        *parent, last = generator.choice(nodes)
        holder: Any = document
        for key in parent:
            holder = holder[key]
        holder[last] = generator.choice(FUZZ_VALUES)
        path.write_text(json.dumps(document))
        status = main(["import-dump", str(npu_dump), "--golden-dir", str(tmp_path / "store")])
        assert status in (0, 1, 2), (parent, last)
    assert "Traceback" not in capsys.readouterr().err
