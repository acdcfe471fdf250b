"""ATB status codes (``atb::ErrorType`` in ATB's ``include/atb/types.h``, in declaration order)."""

from __future__ import annotations

STATUS_NAMES: dict[int, str] = {
    0: "NO_ERROR",
    1: "ERROR_INVALID_PARAM",
    2: "ERROR_INVALID_GRAPH",
    3: "ERROR_INTERNAL_ERROR",
    4: "ERROR_RT_FAIL",
    5: "ERROR_INVALID_IN_TENSOR_NUM",
    6: "ERROR_INVALID_TENSOR_DTYPE",
    7: "ERROR_INVALID_TENSOR_FORMAT",
    8: "ERROR_INVALID_TENSOR_DIM",
    9: "ERROR_INVALID_TENSOR_SIZE",
    10: "ERROR_OPERATION_NULL_RUNNER",
    11: "ERROR_GRAPH_INFERSHAPE_FUNC_FAIL",
    12: "ERROR_CANN_ERROR",
    13: "ERROR_INVALID_TENSOR_INI_MATCH",
    14: "ERROR_INVALID_TENSOR_ADDR",
    15: "ERROR_INVALID_TENSOR_NUM",
    16: "ERROR_INVALID_TENSOR_DIM_NUM",
    17: "ERROR_INVALID_SINGLE_OPERATION_PARAM",
    18: "ERROR_GRAPH_NODE_RESHAPE_FUNC_FAIL",
    19: "ERROR_INVALID_GRAPH_NODE_CHUNK",
    20: "ERROR_INVALID_CONTEXT_ADDR",
    21: "ERROR_INVALID_STREAM",
    22: "ERROR_INVALID_WORKSPACE_SIZE",
    23: "ERROR_INVALID_WORKSPACE_ADDR",
    24: "ERROR_INVALID_OPERATION_ADDR",
    25: "ERROR_HCCL_FAIL",
    26: "ERROR_OUT_OF_DEVICE_MEMORY",
    27: "ERROR_OUT_OF_HOST_MEMORY",
    28: "ERROR_COMM_EMPTY",
    29: "ERROR_COPY_HOST_MEMORY_FAIL",
}
STATUS_CODES: dict[str, int] = {name: code for code, name in STATUS_NAMES.items()}
#: Where an error surfaces: CreateOperation, Setup (inside GetWorkspaceSize), or Execute.
STAGES = ("create", "setup", "execute")


def status_name(code: int) -> str:
    """The symbolic name of an ATB status code (``UNKNOWN_STATUS_<n>`` if it has none)."""
    return STATUS_NAMES.get(code, f"UNKNOWN_STATUS_{code}")
