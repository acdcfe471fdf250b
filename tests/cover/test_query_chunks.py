"""golden.building.relations.query_chunk: a chunk's float64 golden is exactly its rows of the whole prefill."""

from __future__ import annotations

import numpy as np
import pytest

from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.reference import reference_attention
from mlaconf.golden.building.relations import query_chunk
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case

FULL = build_case(
    dict(q_seqlen=[70, 33], head_num=2, kv_head_num=1, dtype="bf16", mask_type=3, kv_layout="padded", seed=5),
    source="test_query_chunks",
)
PREFIXED = build_case(
    dict(q_seqlen=[9, 20], kv_seqlen=[40, 20], head_num=2, dtype="fp16", mask_type=3, kv_layout="padded", seed=6),
    source="test_query_chunks",
)


@pytest.mark.parametrize("spec", [FULL, PREFIXED], ids=["full", "prefixed"])
@pytest.mark.parametrize("part", ["last", "first", "middle"])
def test_a_chunk_sees_the_keys_its_rows_saw(spec: CaseSpec, part: str) -> None:
    inputs = generate_inputs(spec)
    q = list(spec.q_seqlen)
    starts, stops = {
        "last": ([n - n // 3 - 1 for n in q], q),
        "first": ([0] * len(q), [n // 2 + 1 for n in q]),
        "middle": ([n // 4 for n in q], [n // 4 + n // 2 for n in q]),
    }[part]
    chunk_inputs, chunk_spec, rows = query_chunk(inputs, spec, starts, stops)
    assert list(chunk_spec.q_seqlen) == [e - s for s, e in zip(starts, stops, strict=True)]
    assert list(chunk_spec.kv_seqlen) == [kv - n + e for kv, n, e in zip(spec.kv_seqlen, q, stops, strict=True)]
    whole, _ = reference_attention(inputs, spec)
    chunk, _ = reference_attention(chunk_inputs, chunk_spec)
    shape = (-1, spec.head_num * 128)
    np.testing.assert_allclose(chunk.reshape(shape), whole.reshape(shape)[rows], rtol=0, atol=1e-12)
    # a chunk without its prefix is another problem: the relation is not vacuous
    if part != "first":
        short = query_chunk(inputs, spec, [0] * len(q), [e - s for s, e in zip(starts, stops, strict=True)])
        other, _ = reference_attention(short[0], short[1])
        assert np.abs(other.reshape(shape) - whole.reshape(shape)[rows]).max() > 1e-3


def test_only_causal_cases_have_chunks() -> None:
    spec = build_case(dict(q_seqlen=[8], head_num=1, mask_type=0), source="t")
    with pytest.raises(ValueError, match="causal"):
        query_chunk(generate_inputs(spec), spec, [0], [4])
    with pytest.raises(ValueError, match="outside q_seqlen"):
        query_chunk(generate_inputs(FULL), FULL, [0, 5], [71, 6])
