"""One catalogue of kernel mistakes (facts/mistakes.py) serves the planted defects and the likely-cause diagnosis:
every mistake it holds is planted under its name with its words and diagnosed under its name with its words,
and each rule computes what both sides computed when they wrote it themselves."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from mlaconf.facts import mistakes
from mlaconf.harness import defects
from mlaconf.judge import causes


@pytest.mark.parametrize("mistake", mistakes.KERNEL_MISTAKES.values(), ids=list(mistakes.KERNEL_MISTAKES))
def test_every_mistake_is_planted_and_diagnosed_in_its_words(mistake: mistakes.KernelMistake) -> None:
    planted = defects.ENTRIES[mistake.name]
    assert planted.description == mistake.planted
    diagnosed = [cause for cause in causes.CATALOGUE if cause.name == mistake.name]
    assert [cause.text for cause in diagnosed] == [mistake.explains]


def test_a_mistake_both_sides_know_is_in_the_catalogue() -> None:
    """A name the defects and the causes share is one mistake, catalogued once."""
    shared = set(defects.ENTRIES) & {cause.name for cause in causes.CATALOGUE}
    assert shared == set(mistakes.KERNEL_MISTAKES)


def test_the_scale_rounding_is_torchs_and_ml_dtypes() -> None:
    """scale_in_input_dtype rounds like torch (the defect's arithmetic before) and like numpy/ml_dtypes (the
    cause's), double rounding through fp32 included."""
    rng = np.random.default_rng(7)
    values = [*rng.uniform(1e-3, 2.0, 2000), *np.exp(rng.uniform(-10.0, 5.0, 2000)), 1 / 192**0.5, 0.1]
    for value in map(float, values):
        for dtype, torch_dtype, numpy_dtype in (
            ("fp16", torch.float16, np.float16),
            ("bf16", torch.bfloat16, ml_dtypes.bfloat16),
        ):
            rounded = mistakes.scale_in_input_dtype(value, dtype)
            assert rounded == float(torch.tensor(value, dtype=torch_dtype))
            assert rounded == float(np.asarray(value, dtype=np.float32).astype(numpy_dtype).astype(np.float64))


def test_the_index_rules() -> None:
    assert mistakes.modulo_kv_heads(8, 2) == [0, 1, 0, 1, 0, 1, 0, 1]  # the operator reads [0, 0, 0, 0, 1, 1, 1, 1]
    assert mistakes.packed_rows([3, 0, 2]) == [(0, 3), (3, 3), (3, 5)]
    assert [mistakes.top_left_mask(m) for m in (0, 2, 3)] == [0, 2, 2]
    assert (mistakes.ignored_scale(0.5), mistakes.squared_scale(0.5)) == (1.0, 0.25)
