"""ATB releases and chips: how CANN versions order, and the operator facts that differ between them.

ATB's public source (hicann/ascend-transformer-boost, release branches ``br_release_cann_<ver>_*``) is
where each fact below was read; docs/operator.md §7 says the same in prose.  Version ranges use the
syntax of ``judge/known_deviations.toml`` (``">=8.2.RC1,<8.3.RC1"``).  A fact is chosen by the installed
release; an unknown release (None) gets the newest value, which is what the documentation describes.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mlaconf.facts.evidence import CONFIDENCES, CONFIRMED, UNCONFIRMED

#: Rank of a tag segment; anything unknown (e.g. CANN's ``T`` test builds) sorts as alpha.
_TAG_RANK = {"alpha": 0, "a": 0, "beta": 1, "b": 1, "rc": 2}
_NUMBER_RANK = 3  # a bare number after a tag (8.2.RC1.1) sorts after the tag itself
_END = (3, -1)  # terminates the segment list: shorter = earlier than any trailing number


def version_key(version: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """A sort key for versions such as ``8.2.RC1``, ``8.3.RC1.alpha002``, ``8.2.0``.

    The leading numbers form the release (padded with zeros to three parts, so ``8.2`` is
    ``8.2.0``); a release candidate belongs *before* its release (``8.2.RC1 < 8.2.0``), and tags
    after it mark builds before the candidate (``8.3.RC1.alpha002 < 8.3.RC1``).  Anything before
    the first digit is ignored, so ``v8.2.RC1`` and ``CANN 8.2.RC1`` read as ``8.2.RC1``.
    """
    first_digit = re.search(r"\d", version)
    if first_digit is None:
        raise ValueError(f"not a version: {version!r}")
    tokens = re.findall(r"\d+|[A-Za-z]+", version[first_digit.start() :])
    release: list[int] = []
    while tokens and tokens[0].isdigit():
        release.append(int(tokens.pop(0)))
    segments: list[tuple[int, int]] = []
    while tokens:
        token = tokens.pop(0)
        if token.isdigit():
            segments.append((_NUMBER_RANK, int(token)))
            continue
        number = int(tokens.pop(0)) if tokens and tokens[0].isdigit() else 0
        segments.append((_TAG_RANK.get(token.lower(), 0), number))
    padded = tuple(release + [0] * max(0, 3 - len(release)))
    return padded, (*segments, _END)


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as version ``a`` sorts before, equal to or after ``b`` (see :func:`version_key`)."""
    (ra, sa), (rb, sb) = version_key(a), version_key(b)
    width = max(len(ra), len(rb))  # 8.2.0 == 8.2.0.0
    left = (ra + (0,) * (width - len(ra)), sa)
    right = (rb + (0,) * (width - len(rb)), sb)
    return (left > right) - (left < right)


def parse_range(text: str) -> list[tuple[str, str]]:
    """``">=8.2.RC1,<9"`` -> ``[(">=", "8.2.RC1"), ("<", "9")]``; a bare version means ``==``."""
    clauses = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(>=|<=|==|!=|>|<)?\s*(\d[\w.\-]*)", part)
        if not match:
            raise ValueError(f"bad version clause {part!r} in {text!r}")
        op, version = match.group(1) or "==", match.group(2)
        version_key(version)  # validates
        clauses.append((op, version))
    return clauses


def in_range(version: str, clauses: list[tuple[str, str]]) -> bool:
    """Whether ``version`` satisfies every clause."""
    return all(_OPERATORS[op](compare_versions(version, bound), 0) for op, bound in clauses)


# -- facts by release ----------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True)
class ByRelease(Generic[T]):
    """A fact whose value depends on the ATB release: ``(range, value)`` pairs, first match wins."""

    name: str
    values: tuple[tuple[str, T], ...]
    #: Where each value was read (repository, branch, path, function).
    source: str
    #: facts.evidence.CONFIRMED or UNCONFIRMED.
    confidence: str

    def __post_init__(self) -> None:
        for text, _ in self.values:
            parse_range(text)  # validates at import: a typo in a range is a bug here, not at run time
        if not self.source or self.confidence not in CONFIDENCES:
            raise ValueError(f"fact {self.name}: needs a source and a confidence in {CONFIDENCES}")

    def at(self, release: str | None) -> T:
        """The value for ``release``; the last (newest) one when the release is unknown or unparsable."""
        if release is not None:
            try:
                for text, value in self.values:
                    if in_range(release, parse_range(text)):
                        return value
            except ValueError:
                pass
        return self.values[-1][1]


#: The first release whose operation takes a rank-3 MASK_FREE mask (and whose kernel then refuses it):
#: commit 0f7d4ade5 ("[fix] mla batch mask", 2025-11-27).  The C interface itself arrived in 8.2.RC1.
#: Unconfirmed boundary: the fix reached br_release_cann_8.3.RC1 as a late cherry-pick and the
#: repository has no release tags, so an 8.3.RC1 package may predate it (cases/errors.toml
#: ``unconfirmed_at`` accepts both answers there; a device run settles it).
MASK_RANK3_FIX = "8.3.RC1"

#: Ranks a MASK_FREE mask may have in the operation's InTensorDimCheckPrefill.  8.2.RC1
#: (src/ops_infer/multi_latent_attention/multi_latent_attention_operation.cpp) wants ``dimNum == 2``
#: and rejects a 3-D mask with ERROR_INVALID_TENSOR_DIM_NUM; from 8.3.RC1 the operation takes 2 or 3
#: and the kernel's MLAOperation::CheckNdMask (mla_operation.cpp) fails a 3-D one: ERROR_RT_FAIL.
MASK_FREE_OP_RANKS: ByRelease[tuple[int, ...]] = ByRelease(
    "mask_free_op_ranks",
    ((f"<{MASK_RANK3_FIX}", (2,)), (f">={MASK_RANK3_FIX}", (2, 3))),
    source="hicann/ascend-transformer-boost br_release_cann_8.2.RC1 (src/ops_infer/...) and master (ddcc8b6225b8, "
    "src/ops/ops_infer/...): multi_latent_attention/multi_latent_attention_operation.cpp InTensorDimCheckPrefill; "
    "commit 0f7d4ade5; the 8.3.RC1 package boundary is unconfirmed (cases/errors.toml unconfirmed_at)",
    confidence=UNCONFIRMED,
)

#: Why prefill rejects maskType 4 (SWA_NORM) through the C interface, at create with
#: ERROR_INVALID_PARAM in every release: 8.2.RC1's ParamRangeCheck (maskType out of range), or, later,
#: ParamPrefillCheck's window the C interface cannot pass.  Both read in source: SWA_NORM (commit
#: f9e9e6bd5) is an ancestor of br_release_cann_8.3.RC1 and not of br_release_cann_8.2.RC1, so this
#: boundary is a release boundary (unlike MASK_RANK3_FIX's cherry-pick, whose bound it shares).
SWA_NORM_REJECTION: ByRelease[str] = ByRelease(
    "swa_norm_rejection",
    (
        (
            f"<{MASK_RANK3_FIX}",
            "ParamRangeCheck refuses maskType 4 (8.2.RC1 knows no SWA_NORM: its mask range ends at CAUSAL)",
        ),
        (
            f">={MASK_RANK3_FIX}",
            "SWA_NORM needs windowSize > 0, which the C interface cannot pass (windowSize defaults to 0)",
        ),
    ),
    source="hicann/ascend-transformer-boost br_release_cann_8.2.RC1 (77fc1a5eb94a): "
    "src/ops_infer/multi_latent_attention/multi_latent_attention_operation.cpp:130-131 ParamRangeCheck "
    "(maskType > MASK_TYPE_CAUSAL_MASK, the enum's last value in include/atb/infer_op_params.h:2917), "
    "called at :66 before ParamPrefillCheck; br_release_cann_8.3.RC1 (4a985f6707a4) same file :165-167 and "
    "master (ddcc8b6225b8) src/ops/ops_infer/multi_latent_attention/multi_latent_attention_operation.cpp:196-198 "
    "ParamPrefillCheck (windowSize <= 0 refused); include/atb/infer_op_params.h windowSize = 0 (master :2965, "
    "8.3.RC1 :2961); "
    "atb_acl_mla.cpp never sets windowSize (all three branches)",
    confidence=CONFIRMED,
)

# -- chips ---------------------------------------------------------------------------------------

#: ``Config::InitSocVersion`` (src/atb/utils/config.cpp): Is910B() holds for a SoC name that contains
#: "Ascend910B" and is longer than it (Ascend910B1..B4), or contains "Ascend910_93" (A3).  A bare
#: "Ascend910B" is a 910A-class part.  MLA's CreateOperation returns ERROR_INVALID_PARAM on any other.
_ASCEND_910B = "Ascend910B"
_ASCEND_910_93 = "Ascend910_93"


def atb_mla_supports_soc(soc_name: str) -> bool:
    """Whether ATB's MLA operation can be created on this SoC (Atlas A2/A3 inference parts only)."""
    return (_ASCEND_910B in soc_name and len(soc_name) > len(_ASCEND_910B)) or _ASCEND_910_93 in soc_name


#: The evidence of the facts above that are no ByRelease: (source, confidence) by name.
EVIDENCE: dict[str, tuple[str, str]] = {
    "MASK_RANK3_FIX": (
        "hicann/ascend-transformer-boost commit 0f7d4ade5 ('[fix] mla batch mask', 2025-11-27) on master and, as a "
        "late cherry-pick, br_release_cann_8.3.RC1; no release tags say which 8.3.RC1 package has it",
        UNCONFIRMED,
    ),
    "atb_mla_supports_soc": (
        "hicann/ascend-transformer-boost (ddcc8b6225b8) src/atb/utils/config.cpp Config::InitSocVersion, Is910B; "
        "MultiLatentAttention CreateOperation",
        CONFIRMED,
    ),
}


def soc_rejection(soc_name: str) -> str | None:
    """Why ATB's MLA refuses this SoC, or None when it is supported."""
    if atb_mla_supports_soc(soc_name):
        return None
    return (
        f"SoC {soc_name!r}: ATB's MLA runs only on Atlas 800I A2/A3 (Ascend910B<n>, Ascend910_93*); "
        "CreateOperation returns ERROR_INVALID_PARAM on any other chip (src/atb/utils/config.cpp, Is910B)"
    )
