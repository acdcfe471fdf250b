"""Plain data carried between the generator, the store and the suites."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlaconf.facts.operator import scores_in_fp16
from mlaconf.golden.specs.spec import CaseSpec

#: Why a sampled golden's row was chosen, one bit each (bit i is ``1 << i``; golden/specs/sample.py explains them).
REASONS = ("batch_edge", "tile_edge", "q_offset", "kv_offset", "diagonal", "random")


def reason_bit(name: str) -> int:
    """The bit of one reason in :data:`REASONS`."""
    return 1 << REASONS.index(name)


@dataclass(frozen=True)
class RowSample:
    """Token rows (sorted, distinct, int64) and, per row, the bits of the reasons it was chosen for (uint8)."""

    rows: np.ndarray
    reasons: np.ndarray

    def counts(self) -> dict[str, int]:
        """Rows chosen for each reason (a row chosen for two counts in both)."""
        return {name: int(np.count_nonzero(self.reasons & reason_bit(name))) for name in REASONS}

    def summary(self, total_rows: int) -> dict[str, object]:
        """What a record says about the rows judged: how many of how many, and how many per reason."""
        return {"rows": int(self.rows.size), "of": int(total_rows), "reasons": self.counts()}


INPUT_NAMES = ("q", "q_rope", "k", "k_rope", "v", "q_seqlen", "kv_seqlen", "mask")
#: The inputs a sampled golden draws again rather than stores (:class:`InputsRecord`).
TENSOR_NAMES = INPUT_NAMES[:5]
#: The float64-computed magnitudes a golden stores (golden.building.magnitudes computes them, the judge reads them).
ELEMENT_MAGNITUDES = ("pv_abs", "pv_rss", "pvs_rss", "pv_scale", "pv_sub")
#: Element magnitudes only the fp16 score path needs (T is stored on every case: the judge projects
#: every output's error on it, judge/systematic.py).
SCORE_PATH_MAGNITUDES = ("pvs_rss",)
#: Element magnitudes only fp16 cases need (P below fp16's smallest normal 2^-14 may be flushed to zero).
FP16_MAGNITUDES = ("pv_sub",)
ROW_MAGNITUDES = ("score_absmax", "score_dot", "p_rss")


@dataclass(frozen=True)
class OpInputs:
    """The operator's inputs exactly as the C interface takes them, as host numpy arrays.

    Floating tensors hold device-dtype values: ``np.float16`` for fp16 and ``ml_dtypes.bfloat16``
    for bf16.  Layouts follow the case (q 2-D ``[T, H*128]`` or 3-D ``[T, H, 128]``; kv padded
    ``[B, S, Hkv*D]`` or packed ``[sum(kv), Hkv, D]``).  ``mask`` is the 512x512 compressed causal
    mask for MASK_FREE and ``None`` otherwise.
    """

    q: np.ndarray
    q_rope: np.ndarray
    k: np.ndarray
    k_rope: np.ndarray
    v: np.ndarray
    q_seqlen: np.ndarray
    kv_seqlen: np.ndarray
    mask: np.ndarray | None

    def arrays(self) -> dict[str, np.ndarray]:
        """Name -> array for every present input, in the C interface's order."""
        out = {name: getattr(self, name) for name in INPUT_NAMES}
        return {name: arr for name, arr in out.items() if arr is not None}


@dataclass(frozen=True)
class InputsRecord:
    """What a sampled golden keeps of its inputs instead of them (golden/building/blocks.py draws them again):
    the generator's version, the seed and the xxh3-128 of each tensor's bytes as a golden would store them;
    ``origin`` is the file it was read from ("" when built in this process)."""

    generator: str
    seed: int
    digests: dict[str, str]
    origin: str = ""


@dataclass(frozen=True)
class GoldenCase:
    """A case's inputs with its float64 reference and the emulated same-dtype baseline (of every row, or of a
    row sample)."""

    spec: CaseSpec
    inputs: OpInputs
    out: np.ndarray  # float64, q's layout
    row_valid: np.ndarray  # bool [T]: rows of zero-length batches are "don't care"
    baseline_out: np.ndarray  # case dtype, q's layout: emulated ATB precision path
    baseline_stats: dict[str, float | int | bool | str] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    #: float64-computed magnitudes of the attention sums (golden.building.magnitudes), name -> float32 array:
    #: element ones in attenOut's layout, row ones [T, H].  The error-model rule needs them.
    magnitudes: dict[str, np.ndarray] = field(default_factory=dict)
    #: A sampled golden's rows (spec.rows set): ``out``, ``row_valid``, ``baseline_out`` and the magnitudes then
    #: hold one row per sampled token row, in the sample's order.  None: every row.
    sample: RowSample | None = None
    #: A sampled golden's inputs as the store keeps them (seed, generator, digests); until they are drawn again
    #: (golden/building/blocks.py ``with_inputs``) ``inputs`` holds only the lengths and the mask.
    inputs_record: InputsRecord | None = None

    @property
    def holds_inputs(self) -> bool:
        """Whether ``inputs`` holds q, qRope, k, kRope and v (not only a record of them)."""
        return self.inputs_record is None or self.inputs.q.size > 0

    @property
    def token_rows(self) -> np.ndarray | None:
        """The token row of each row of ``out`` when sampled, None when ``out`` holds every row."""
        return None if self.sample is None else self.sample.rows


def element_magnitudes(spec: CaseSpec) -> tuple[str, ...]:
    """The element magnitudes stored for ``spec``."""
    skip: tuple[str, ...] = () if scores_in_fp16(spec.dtype, spec.mask_type) else SCORE_PATH_MAGNITUDES
    skip += () if spec.dtype == "fp16" else FP16_MAGNITUDES
    return tuple(n for n in ELEMENT_MAGNITUDES if n not in skip)


def magnitude_names(spec: CaseSpec) -> tuple[str, ...]:
    """Every magnitude stored for ``spec`` (element ones first)."""
    return element_magnitudes(spec) + ROW_MAGNITUDES
