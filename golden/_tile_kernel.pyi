"""Type stub of the compiled extension (golden/src/tile_kernel.cpp)."""

import numpy as np

def softmax_tile(
    scores: np.ndarray,
    stats: np.ndarray,
    causal_first: int | None,
    p32: np.ndarray | None,
    p2_32: np.ndarray | None,
    floor: float,
    raw: np.ndarray | None = None,
) -> None: ...
def exp_nonpositive(x: np.ndarray) -> np.ndarray: ...
def scaled_products(p: np.ndarray, denom: np.ndarray, raw: np.ndarray, ps: np.ndarray, sums: np.ndarray) -> None: ...
def round_to_bf16(values: np.ndarray, out: np.ndarray) -> bool: ...
def baseline_softmax_tile(
    scores: np.ndarray, denom: np.ndarray, scale: float, causal_first: int | None, dtype: str
) -> None: ...
