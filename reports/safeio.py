"""Report files written atomically without following links, and JSON read with bounds.

Writers: the text goes to a temporary file created exclusively under a unique name beside the
target (:func:`tempfile.mkstemp`: ``O_CREAT | O_EXCL``, so a planted file or symlink there is
never opened), then renamed over the target; a symlink at the target is refused rather than
followed or replaced.  Two runs finishing together never share a temporary file, and a reader
sees the old file or the new one, never a mix.

Report files are readable like the goldens (``0644`` less the umask), not ``mkstemp``'s ``0600``.

Readers: :func:`read_text` opens without following links (a symlinked results.jsonl or run.json
is refused: a reader must not be pointed at another run's, or any, file) and refuses a file whose
parsed form would not fit in the memory available now; :func:`loads` rejects what ``json`` alone
accepts but a report must not hold: duplicate keys, nesting deeper than :data:`MAX_DEPTH` (no
RecursionError anywhere downstream) and, with ``where``, names the file and line in every error.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

#: Deepest nesting of arrays/objects a report file may hold (records need 5).
MAX_DEPTH = 32
#: Bytes of Python objects one byte of report JSON may become once parsed (dicts, floats, strings).
PARSED_BYTES_PER_BYTE = 12


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Mode of every report file: what ``open(..., 0o644)`` gives the goldens under this process's umask.
REPORT_MODE = 0o644 & ~_umask()


class ReportFileError(ValueError):
    """A report file that cannot be read or written as it is (the message names it)."""


def atomic_write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a fresh temporary file; refuse a symlink at ``path``."""
    if path.is_symlink():
        raise ReportFileError(f"{path}: is a symbolic link; refusing to write through it")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, REPORT_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if path.is_symlink():  # planted while we wrote: still never replace a link
            raise ReportFileError(f"{path}: is a symbolic link; refusing to write through it")
        os.replace(tmp, path)  # rename never follows a link at either name
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def create_exclusive(path: Path, text: str) -> Path:
    """Create ``path`` with ``text`` only if nothing (no file, no link) is there: FileExistsError otherwise."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def safe_dir(path: Path) -> Path:
    """Create ``path`` (and parents) as a directory; a symlink there is refused."""
    if path.is_symlink():
        raise ReportFileError(f"{path}: is a symbolic link; refusing to write reports through it")
    path.mkdir(parents=True, exist_ok=True)
    return path


def move_aside(directory: Path) -> Path | None:
    """A non-empty ``directory`` renamed to its first free sibling ``<name>.previous-N`` (nothing is lost and
    nothing is overwritten); None when there was nothing to move."""
    if not directory.is_dir() or directory.is_symlink() or not any(directory.iterdir()):
        return None
    number = 1
    while (aside := directory.with_name(f"{directory.name}.previous-{number}")).exists():
        number += 1
    os.rename(directory, aside)
    return aside


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ReportFileError(f"duplicate key {key!r}")
        out[key] = value
    return out


def depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((v, level) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def loads(text: str, where: str) -> Any:
    """Parse one JSON document; every problem raises ReportFileError starting with ``where``
    (``file`` or ``file:line``)."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ReportFileError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ReportFileError as exc:
        raise ReportFileError(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportFileError(f"{where}: not JSON: {exc}") from None
    if depth(value) > MAX_DEPTH:
        raise ReportFileError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    return value


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation now (Linux MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def read_text(path: Path) -> str:
    """A report file's text.  Refused in one line naming it: a symbolic link (never followed), a
    non-regular file (FIFO, device: it would hang), a file too large to parse in the memory
    available now, text that is not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if path.is_symlink():
            raise ReportFileError(f"{path}: is a symbolic link; a report is read only from a regular file") from None
        raise ReportFileError(f"{path}: cannot be read: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a directory, FIFO or device: refused before any read
        os.close(fd)
        raise ReportFileError(f"{path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        free = available_memory()
        if free is not None and info.st_size * PARSED_BYTES_PER_BYTE > free:
            raise ReportFileError(
                f"{path}: {info.st_size} bytes would need about {info.st_size * PARSED_BYTES_PER_BYTE >> 20} MiB "
                f"parsed, more than the {free >> 20} MiB of memory available"
            )
        data = handle.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportFileError(f"{path}: not UTF-8 text: {exc}") from None
