"""An msprobe dump read: the forward calls of every ``dump.json`` under a folder (``step<N>/rank<R>/`` or
``step<N>/proc<pid>/``) and their tensors, each held to what ``dump.json`` declares of it.  What a damaged dump
holds is one :class:`Unrecoverable` line, never a traceback: tools/msprobe_dump.py makes cases of the calls."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Deepest list nesting an argument may have (no op argument nests at all; deeper is a damaged dump).
MAX_NESTING = 8
#: A tensor file's name as msprobe writes it: one path component, no separator.
_DATA_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,255}")
#: Relative agreement of a tensor's mean and norm with dump.json's (stated in the tensor's dtype: bf16 keeps
#: 8 significant bits, so its statistics are within 2^-8 of the float64 ones; 2^-6 leaves room for a device's
#: order of summation).
STAT_RTOL = 2.0**-6
#: ... and the mean's absolute slack in units of the largest |element| (a sum that cancels to near zero).
MEAN_ATOL = 2.0**-16
_CALL = re.compile(r"(?P<prefix>[A-Za-z_]+)\.(?P<api>.+)\.(?P<index>\d+)\.forward$")


class Unrecoverable(ValueError):
    """A call that cannot become a case; the message is the one line said about it."""


@dataclass(frozen=True)
class DumpedCall:
    """One forward call of a dump: its name, where its tensors lie, and its entries as msprobe wrote them."""

    name: str
    api: str
    where: str
    tensor_dir: Path
    args: list[Any]
    kwargs: dict[str, Any]
    output: list[Any]


def read_dump(root: Path) -> list[DumpedCall]:
    """Every forward call of every ``dump.json`` under ``root`` (step/rank or proc folders), in path order."""
    files = sorted(root.rglob("dump.json")) if root.is_dir() else []
    if not files:
        raise Unrecoverable(f"{root}: no dump.json under it (an msprobe dump folder, task tensor)")
    calls = []
    for path in files:
        data = _dump_data(path)
        where = str(path.parent.relative_to(root)) if path.parent != root else "."
        for name, entry in data.items():
            match = _CALL.match(name)
            if match is None or not isinstance(entry, dict):
                continue
            calls.append(
                DumpedCall(
                    name=name,
                    api=match["api"].removeprefix("atb."),
                    where=where,
                    tensor_dir=path.parent / "dump_tensor_data",
                    args=_field(entry, "input_args", list),
                    kwargs=_field(entry, "input_kwargs", dict),
                    output=_field(entry, "output", list),
                )
            )
    return calls


def _dump_data(path: Path) -> dict[str, Any]:
    """A dump.json's ``data`` table; a FIFO, device or unreadable file is refused before it is opened."""
    if not path.is_file():
        raise Unrecoverable(f"{path}: not a regular file (an msprobe dump.json is one)")
    try:
        data = json.loads(path.read_text())["data"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise Unrecoverable(f"{path}: not an msprobe dump.json ({type(err).__name__}: {err})") from err
    if not isinstance(data, dict):
        raise Unrecoverable(f"{path}: not an msprobe dump.json (its data is a {type(data).__name__}, not an object)")
    return data


def _field(entry: dict[str, Any], name: str, kind: type) -> Any:
    """One of a call's ``input_args``/``input_kwargs``/``output`` as written, or an empty one where it is absent;
    one of the wrong type stays as it is, and the call is refused when it is read (:func:`_check_fields`)."""
    value = entry.get(name)
    return kind() if value is None else value


def is_tensor(entry: Any) -> bool:
    return isinstance(entry, dict) and str(entry.get("type", "")).endswith("Tensor")


def value_of(call: DumpedCall, name: str, entry: Any, depth: int = 0) -> Any:
    """A dumped argument as a Python value: a tensor (numpy, loaded from its file), a scalar, a list, None."""
    if depth > MAX_NESTING:
        raise Unrecoverable(f"argument {name} is nested more than {MAX_NESTING} deep: no op argument is")
    if entry is None:
        return None
    if isinstance(entry, list):
        return [value_of(call, name, item, depth + 1) for item in entry]
    if not isinstance(entry, dict):
        return entry
    if is_tensor(entry):
        return _tensor(call, name, entry)
    return entry.get("value")


def _tensor(call: DumpedCall, name: str, entry: dict[str, Any]) -> np.ndarray:
    data_name = entry.get("data_name")
    if not data_name:
        raise Unrecoverable(f"tensor {name} has no data_name: the dump holds statistics only (dump with task tensor)")
    if not isinstance(data_name, str) or not _DATA_NAME.fullmatch(data_name) or data_name in (".", ".."):
        raise Unrecoverable(f"tensor {name}: data_name {str(data_name)[:80]!r} is not a file name in dump_tensor_data")
    path = call.tensor_dir / data_name
    try:
        if not path.is_file():
            raise Unrecoverable(f"tensor {name}: {path} is missing or not a regular file")
        if path.suffix == ".npy":
            loaded: np.ndarray = np.load(path, allow_pickle=False)
            _check_declared(name, path, entry, loaded, None)
            return loaded
    except (OSError, ValueError) as err:
        raise Unrecoverable(f"tensor {name}: {path} is not readable ({type(err).__name__}: {err})") from err
    import torch  # lazily: reading dump.json needs none

    try:
        tensor = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a bad file; the line names it
        raise Unrecoverable(f"tensor {name}: {path} is not readable ({type(err).__name__}: {err})") from err
    if not isinstance(tensor, torch.Tensor):
        raise Unrecoverable(f"tensor {name}: {path} holds a {type(tensor).__name__}, not a tensor")
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        array: np.ndarray = tensor.view(torch.int16).numpy().view(np.uint16).view(ml_dtypes.bfloat16)
    else:
        array = tensor.numpy()
    _check_declared(name, path, entry, array, str(tensor.dtype))
    return array


def _check_declared(name: str, path: Path, entry: dict[str, Any], array: np.ndarray, dtype: str | None) -> None:
    """The tensor file against what dump.json says of it: shape and dtype exactly, the largest and smallest
    element exactly, the mean and norm within their rounding (msprobe states them in the tensor's dtype), so
    a damaged or swapped file is refused rather than imported."""
    declared_dtype, shape = entry.get("dtype"), entry.get("shape")
    if dtype is not None and isinstance(declared_dtype, str) and declared_dtype != dtype:
        raise Unrecoverable(f"tensor {name}: {path} holds {dtype}, dump.json declares {declared_dtype}")
    if isinstance(shape, list) and list(array.shape) != shape:
        raise Unrecoverable(f"tensor {name}: {path} has shape {list(array.shape)}, dump.json declares {shape}")
    values = array.astype(np.float64)
    if values.size == 0 or not np.isfinite(values).all():
        return  # nothing to compare, or non-finite: said by the case's own check
    largest = float(np.abs(values).max())
    mean, norm = float(values.mean()), float(np.sqrt(np.square(values).sum()))
    measured = {  # stat -> (ours, how far the stated one may be: extremes are elements, exact in any dtype)
        "Max": (float(values.max()), 0.0),
        "Min": (float(values.min()), 0.0),
        "Mean": (mean, STAT_RTOL * abs(mean) + MEAN_ATOL * largest),
        "Norm": (norm, STAT_RTOL * norm),
    }
    for stat, (value, slack) in measured.items():
        stated = entry.get(stat)
        if isinstance(stated, bool) or not isinstance(stated, (int, float)) or not math.isfinite(stated):
            continue
        if abs(value - stated) > slack:
            raise Unrecoverable(
                f"tensor {name}: {path} does not match dump.json ({stat} {value:.6g}, declared {stated:.6g}): "
                "damaged or not this call's file"
            )


def check_fields(call: DumpedCall) -> None:
    """A call's entries are of msprobe's kinds: positional arguments and outputs lists, keywords an object."""
    for what, value, kind in (("input_args", call.args, list), ("input_kwargs", call.kwargs, dict)):
        if not isinstance(value, kind):
            raise Unrecoverable(f"{what} is a {type(value).__name__}, not a {kind.__name__}")
    if not isinstance(call.output, list):
        raise Unrecoverable(f"output is a {type(call.output).__name__}, not a list")
