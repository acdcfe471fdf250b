"""The benchmark's cases by name, apart from the measuring code so ``mlaconf bench --help`` lists them without
loading numpy's extensions (docs/architecture.md, "A CLI that starts at once")."""

from __future__ import annotations

from typing import Any

#: The benchmark's cases: name -> spec fields (one batch, 16 heads, bf16 inputs).
CASES: dict[str, dict[str, Any]] = {
    "causal-4096": {"q_seqlen": [4096], "head_num": 16, "mask_type": "mask_free"},
    "bidir-4096": {"q_seqlen": [4096], "head_num": 16, "mask_type": "undefined"},
    "causal-16384": {"q_seqlen": [16384], "head_num": 16, "mask_type": "mask_free"},
}
