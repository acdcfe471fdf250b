"""Type stub of the compiled extension (golden/building/src/tile_kernel.cpp)."""

import numpy as np

def softmax_tile(
    scores: np.ndarray,
    stats: np.ndarray,
    causal_first: int | None,
    p32: np.ndarray | None,
    p2_32: np.ndarray | None,
    floor: float,
    raw: np.ndarray | None = None,
    ps: np.ndarray | None = None,
    ps_sums: np.ndarray | None = None,
    counts: np.ndarray | None = None,
) -> None: ...
def row_scores(q: np.ndarray, kp: np.ndarray, out: np.ndarray) -> None: ...
def weighted_rows(w: np.ndarray, m: np.ndarray, out: np.ndarray) -> None: ...
def exp_nonpositive(x: np.ndarray) -> np.ndarray: ...
def finish_magnitudes(
    abs_sum: np.ndarray,
    sq_sum: np.ndarray,
    psv: np.ndarray,
    golden: np.ndarray,
    denom: np.ndarray,
    ps_sums: np.ndarray,
    scale: np.ndarray,
    cap: np.ndarray,
    vmax: np.ndarray,
    add: float,
    factor: float,
    gamma: float,
    pv_abs: np.ndarray,
    pv_rss: np.ndarray,
    pv_scale: np.ndarray,
) -> None: ...
def round_to_bf16(values: np.ndarray, out: np.ndarray) -> bool: ...
def baseline_softmax_tile(
    scores: np.ndarray, denom: np.ndarray, scale: float, causal_first: int | None, dtype: str
) -> None: ...
