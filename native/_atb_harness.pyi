"""Type stub of the compiled extension (native/src/atb_harness.cpp)."""

from collections.abc import Callable, Sequence
from typing import Literal

STATUS_COUNT: int
ACL_FLOAT: int
ACL_FLOAT16: int
ACL_INT32: int
ACL_INT64: int
ACL_BOOL: int
ACL_BF16: int
ACL_FORMAT_NCHW: int
ACL_FORMAT_NHWC: int
ACL_FORMAT_ND: int
ACL_FORMAT_FRACTAL_NZ: int

class AtbLoadError(OSError): ...

class AtbStatusError(RuntimeError):
    status: int
    status_name: str
    stage: Literal["create", "setup", "execute"]
    detail: str

class Library:
    def __init__(self, path: str | None = None) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def acl_source(self) -> str: ...

class Context:
    def __init__(self, library: Library) -> None: ...

def status_name(status: int) -> str: ...
def prefill(
    context: Context,
    tensors: Sequence[tuple[str, int, Sequence[int], int, int]],
    host_tensors: Sequence[tuple[str, bytes, Sequence[int], int, int]],
    head_num: int,
    qk_scale: float,
    kv_head_num: int,
    mask_type: int,
    cache_mode: int,
    stream: int,
    alloc_workspace: Callable[[int], int],
    synchronize: Callable[[], None],
) -> int: ...
