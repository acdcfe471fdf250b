"""Pure-Python side of the native ATB harness: the descriptors and aclDataType codes it takes.

Kept free of the compiled extension so that callers (and the availability probe) can import it
even where ``native._atb_harness`` failed to build; the extension itself is typed by its ``.pyi``.
"""

from __future__ import annotations

from typing import NamedTuple

#: aclDataType codes (acl/acl_base.h); native/src/atb_abi.h holds the same values.
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT32 = 3
ACL_BF16 = 27
#: aclFormat ACL_FORMAT_ND: ATB reads every tensor as contiguous ND.
ACL_FORMAT_ND = 2


class TensorDesc(NamedTuple):
    """One device tensor as the harness hands it to aclCreateTensor: contiguous, format ND."""

    name: str
    ptr: int
    shape: tuple[int, ...]
    dtype: int
