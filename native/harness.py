"""Pure-Python side of the native ATB harness: the descriptors and aclDataType codes it takes.

Kept free of the compiled extension so that callers (and the availability probe) can import it
even where ``mlaconf.native._atb_harness`` failed to build; the extension itself is typed by its ``.pyi``.
"""

from __future__ import annotations

from typing import NamedTuple

#: aclDataType codes (acl/acl_base.h); native/src/atb_abi.h holds the same values.
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT32 = 3
ACL_INT64 = 9
ACL_BOOL = 12
ACL_BF16 = 27
#: aclFormat codes: ATB reads every tensor as contiguous ND; the others exist to be rejected.
ACL_FORMAT_NCHW = 0
ACL_FORMAT_NHWC = 1
ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29


class TensorDesc(NamedTuple):
    """One device tensor as the harness hands it to aclCreateTensor: contiguous, offset 0."""

    name: str
    ptr: int
    shape: tuple[int, ...]
    dtype: int
    format: int = ACL_FORMAT_ND


class HostTensorDesc(NamedTuple):
    """A host tensor (qSeqLen, kvSeqLen): its bytes, which the harness copies into a buffer it owns."""

    name: str
    data: bytes
    shape: tuple[int, ...]
    dtype: int
    format: int = ACL_FORMAT_ND
