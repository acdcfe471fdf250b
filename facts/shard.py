"""The one shard rule: ``mlaconf regen --shard`` and ``pytest --mla-shard`` must pick the same cases."""

from __future__ import annotations

import hashlib
import re

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` (1-based K) -> (K, N); ValueError with the reason otherwise."""
    match = _SHARD.match(text)
    if not match:
        raise ValueError(f"shard must look like K/N (e.g. 2/4), got {text!r}")
    k, n = int(match.group(1)), int(match.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"shard {text!r}: need 1 <= K <= N")
    return k, n


def shard_index(content_hash: str, count: int) -> int:
    """Zero-based shard of a case: its content hash (hex) modulo the shard count."""
    try:
        value = int(content_hash, 16)
    except ValueError:  # not a content hash (a node id): hash it, still stable across hosts
        value = int(hashlib.sha256(content_hash.encode()).hexdigest(), 16)
    return value % count


def in_shard(content_hash: str, shard: tuple[int, int] | None) -> bool:
    """Whether a case belongs to shard ``(K, N)``; every case belongs to ``None``."""
    return shard is None or shard_index(content_hash, shard[1]) == shard[0] - 1
