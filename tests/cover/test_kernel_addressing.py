"""The padded-kv deviations select exactly the shipped cases ATB's kernel addressing would misread.

An emulation of the kernel's kv addressing (mla_tiling_dependency.cpp, PrefillTilingParam with
GetKvFactor, read at hicann/ascend-transformer-boost ddcc8b622) runs over every valid case of every
shipped suite: it computes the rows the kernel reads for each batch and compares them with the rows
the case's layout puts that batch in.  Every case a padded-kv deviation selects must be misread, and
every misread case must be selected.
"""

from __future__ import annotations

import functools

import pytest

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import available_suites, load_suites
from mlaconf.judge.deviations import load_deviations

ADDRESSING_DEVIATIONS = ("atb-padded-kv-ragged", "atb-padded-kv-capacity")


def kernel_start_rows(k_first_dim: int, kv_seqlen: tuple[int, ...]) -> list[int]:
    """The row (of k viewed as [rows, Hkv*128]) where the kernel starts each batch: the tiling loop's
    ``addrKSeqOffset`` divided by one row, accumulated with GetKvFactor's factor per batch."""
    batch = len(kv_seqlen)
    max_kv = max(kv_seqlen) if kv_seqlen else 1
    starts, offset = [], 0
    for kv in kv_seqlen:
        starts.append(offset)
        offset += max_kv if batch * max_kv == k_first_dim else kv
    return starts


def layout_start_rows(spec: CaseSpec) -> tuple[int, list[int]]:
    """k's first dim and where each batch's rows really are in the case's layout."""
    if spec.kv_layout == "padded":  # [B, S, Hkv*128]: batch b fills rows b*S .. b*S + kv_b - 1
        return spec.batch, [b * spec.padded_rows for b in range(spec.batch)]
    if spec.kv_layout == "strided":  # [B*max kv, Hkv, 128]: the documented 3-D form, batch b at b * max kv
        return spec.batch * spec.max_kv, [b * spec.max_kv for b in range(spec.batch)]
    starts = [sum(spec.kv_seqlen[:b]) for b in range(spec.batch)]  # packed [sum(kv) (+ spare rows), Hkv, 128]
    return spec.kv_rows, starts


def misread_by_kernel(spec: CaseSpec) -> bool:
    """Whether any batch with query and key rows would read other rows than its own."""
    first_dim, truth = layout_start_rows(spec)
    kernel = kernel_start_rows(first_dim, spec.kv_seqlen)
    for b, (q, kv) in enumerate(zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
        if q > 0 and kv > 0 and range(kernel[b], kernel[b] + kv) != range(truth[b], truth[b] + kv):
            return True
    return False


@functools.cache
def shipped_valid_cases() -> tuple[CaseSpec, ...]:
    names = [name for name in available_suites() if name != "errors"]
    return tuple(load_suites(names))


def selected_by_addressing_deviation(spec: CaseSpec) -> str | None:
    deviations = load_deviations()
    for entry in deviations.entries:
        if entry.id in ADDRESSING_DEVIATIONS and entry.selects("atb", "8.3.RC1", spec):
            return entry.id
    return None


def test_the_emulation_reads_packed_and_full_padded_layouts_correctly() -> None:
    """Sanity: the layouts the kernel was written for are never misread, the documented bad one is."""
    uniform = CaseSpec(q_seqlen=(8, 8, 8), kv_seqlen=(8, 8, 8), head_num=1, kv_head_num=1, kv_layout="padded")
    ragged_packed = CaseSpec(q_seqlen=(3, 9), kv_seqlen=(3, 9), head_num=1, kv_head_num=1)
    last_short = CaseSpec(q_seqlen=(200, 77), kv_seqlen=(328, 205), head_num=1, kv_head_num=1, kv_layout="padded")
    first_short = CaseSpec(q_seqlen=(77, 200), kv_seqlen=(205, 328), head_num=1, kv_head_num=1, kv_layout="padded")
    roomy = CaseSpec(q_seqlen=(4, 4), kv_seqlen=(4, 4), head_num=1, kv_head_num=1, kv_layout="padded", kv_capacity=6)
    ones = CaseSpec(q_seqlen=(1,) * 5, kv_seqlen=(1,) * 5, head_num=1, kv_head_num=1, kv_layout="padded")
    ones_roomy = CaseSpec(
        q_seqlen=(1, 1), kv_seqlen=(1, 1), head_num=1, kv_head_num=1, kv_layout="padded", kv_capacity=2
    )
    strided = CaseSpec(q_seqlen=(4, 8), kv_seqlen=(4, 8), head_num=1, kv_head_num=1, kv_layout="strided")
    assert [misread_by_kernel(s) for s in (uniform, ragged_packed, last_short, ones, strided)] == [False] * 5
    assert [misread_by_kernel(s) for s in (first_short, roomy, ones_roomy)] == [True] * 3


def test_the_one_fact_is_the_kernels_addressing_on_every_shipped_case() -> None:
    """facts.operator.kv_row_starts (what the golden, every backend and the contract read) equals this
    emulation of the kernel for every 3-D case, and the padded layout's b * S for every padded one."""
    from mlaconf.facts.operator import kv_row_starts
    from mlaconf.golden.specs.layout import kv_shape

    cases = shipped_valid_cases()
    assert any(c.kv_layout == "strided" for c in cases), "no shipped strided case: the check could not fail"
    for spec in cases:
        first_dim, truth = layout_start_rows(spec)
        starts = kv_row_starts(kv_shape(spec), spec.kv_seqlen, spec.kv_head_num)
        assert starts == truth, spec.case_id
        if spec.kv_layout != "padded":
            assert starts == kernel_start_rows(first_dim, spec.kv_seqlen), spec.case_id


def test_padded_kv_deviations_select_exactly_the_misread_cases() -> None:
    cases = shipped_valid_cases()
    selected = {c.case_id: selected_by_addressing_deviation(c) for c in cases}
    misread = {c.case_id for c in cases if misread_by_kernel(c)}
    wrongly_selected = sorted(cid for cid, dev in selected.items() if dev and cid not in misread)
    missed = sorted(cid for cid in misread if selected[cid] is None)
    assert not wrongly_selected, f"selected but read correctly by the kernel: {wrongly_selected[:5]}"
    assert not missed, f"misread by the kernel but selected by no deviation: {missed[:5]}"
    assert misread, "no shipped case exercises the misread: the check could not fail"
    padded_correct = [c for c in cases if c.kv_layout == "padded" and c.case_id not in misread]
    assert any(len(set(c.kv_seqlen)) > 1 for c in padded_correct), "no ragged padded case the kernel reads right"


@pytest.mark.parametrize("deviation_id", ADDRESSING_DEVIATIONS)
def test_each_addressing_deviation_selects_some_shipped_case(deviation_id: str) -> None:
    assert any(selected_by_addressing_deviation(c) == deviation_id for c in shipped_valid_cases())


def test_last_batch_short_edge_cases_are_no_longer_expected_failures() -> None:
    """The edge cases q [200, 77], kv [328, 205] padded (8 specs, 24 runs over 3 seeds): only the last
    batch is short, so its packed offset equals the padded one."""
    hits = [c for c in shipped_valid_cases() if c.kv_seqlen == (328, 205) and c.kv_layout == "padded"]
    assert len(hits) == 8
    assert all(selected_by_addressing_deviation(c) is None and not misread_by_kernel(c) for c in hits)
