"""Which levels of the factor model a case hits (a minimal stand-in for the coverage model's classifier).

The factor model (factors and levels, docs/conformance.md) names what a case exercises; a defect's
trigger (:mod:`mlaconf.harness.defects`) is stated in the same terms.  Per-batch factors (q_len,
kv_len, prefix) give a case every level one of its batches hits.  The level rules are the coverage model's
(facts/factors.toml): prefix ``lt128`` 1-127, ``mult128`` a positive multiple of 128, ``mid`` 129-511 and
``long`` above 512, neither a multiple of 128.
"""

from __future__ import annotations

from mlaconf.golden.spec import CaseSpec

#: Query tile rows of ATB's kernel: a query length's residue modulo it decides the last tile.
TILE = 128
#: Keys per slice of ATB's kernel.
SLICE = 512


def _q_levels(q: int) -> set[str]:
    levels = {"one"} if q == 1 else {"lt16"} if q < 16 else set()
    if q > TILE and q % TILE == 1:
        levels.add("mod128_1")
    elif q % TILE == 0:
        levels.add("mod128_0")
    elif q >= 16:
        levels.add("mod128_mid")
    if q > SLICE:
        levels.add("gt512")
    return levels


def _kv_levels(kv: int) -> set[str]:
    residue = next(
        (name for step, name in ((512, "mult512"), (128, "mult128_not512"), (64, "mult64_not128")) if kv % step == 0),
        "mult16_not64" if kv % 16 == 0 else "not_mult16",
    )
    return {residue, "ge4096"} if kv >= 4096 else {residue}


def _prefix_level(prefix: int) -> str:
    if prefix == 0:
        return "zero"
    if prefix < TILE:
        return "lt128"
    if prefix % TILE == 0:
        return "mult128"
    return "mid" if prefix < SLICE else "long"


def case_levels(spec: CaseSpec) -> dict[str, frozenset[str]]:
    """Factor -> the levels ``spec`` hits (batches without query rows count for ``empty_row`` only)."""
    rows = [(q, kv) for q, kv in zip(spec.q_seqlen, spec.kv_seqlen, strict=True) if q > 0]
    batch = {"one"} if spec.batch == 1 else {"two"} if spec.batch == 2 else {"many"}
    if len(rows) < spec.batch:
        batch.add("empty_row")
    structure = spec.structure
    inputs = {"random"} if structure is None else set()
    if structure is not None:
        inputs |= {structure.logits} if structure.logits else set()
        inputs |= {"sinks"} if structure.sink_keys else set()
        inputs |= {"late_max"} if structure.late_from is not None else set()
        inputs |= {"v_mean"} if structure.v_mean is not None else set()
    return {
        "dtype": frozenset({spec.dtype}),
        "mask": frozenset({spec.mask_name}),
        "q_layout": frozenset({spec.q_layout}),
        "kv_layout": frozenset({spec.kv_layout}),
        "batch": frozenset(batch),
        "group": frozenset({str(spec.head_num // spec.kv_head_num)}),
        "kv_heads": frozenset({"one" if spec.kv_head_num == 1 else "two" if spec.kv_head_num == 2 else "many"}),
        "q_len": frozenset(level for q, _ in rows for level in _q_levels(q)),
        "kv_len": frozenset(level for _, kv in rows for level in _kv_levels(kv)),
        "prefix": frozenset(_prefix_level(kv - q) for q, kv in rows),
        "inputs": frozenset(inputs),
    }
