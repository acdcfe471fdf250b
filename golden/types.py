"""Plain data carried between the generator, the store and the suites."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlaconf.golden.spec import CaseSpec

INPUT_NAMES = ("q", "q_rope", "k", "k_rope", "v", "q_seqlen", "kv_seqlen", "mask")


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
class GoldenCase:
    """A case's inputs with its float64 reference and the emulated same-dtype baseline."""

    spec: CaseSpec
    inputs: OpInputs
    out: np.ndarray  # float64, q's layout
    row_valid: np.ndarray  # bool [T]: rows of zero-length batches are "don't care"
    baseline_out: np.ndarray  # case dtype, q's layout: emulated ATB precision path
    baseline_stats: dict[str, float | int | bool | str] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    #: float64-computed magnitudes of the attention sums (golden.magnitudes), name -> float32 array:
    #: element ones in attenOut's layout, row ones [T, H].  The error-model rule needs them.
    magnitudes: dict[str, np.ndarray] = field(default_factory=dict)
