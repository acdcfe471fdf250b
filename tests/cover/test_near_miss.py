"""A near miss of a name is met with what was probably meant: a backend, a spec field, a suite."""

from __future__ import annotations

import pytest

from mlaconf.facts.near_miss import did_you_mean
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.harness.registry import name_problem


def test_the_closest_name_is_suggested_and_a_stranger_gets_none() -> None:
    assert did_you_mean("torch_cpu", ["torch-cpu", "torch-cuda", "atb"]) == " (did you mean 'torch-cpu'?)"
    assert did_you_mean("SMOK", ["smoke", "standard"]) == " (did you mean 'smoke'?)"
    assert did_you_mean("zzz", ["smoke", "standard"]) == ""


def test_a_backend_spelled_with_an_underscore() -> None:
    assert (name_problem("torch_cpu") or "").endswith("(did you mean 'torch-cpu'?)")


def test_a_spec_field_with_a_plural() -> None:
    with pytest.raises(SpecError, match=r"field 'head_nums': unknown field \(did you mean 'head_num'\?\)"):
        build_case({"q_seqlen": [4], "head_nums": 2}, source="mine.toml")
