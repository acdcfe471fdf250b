"""Version probing: CANN toolkit, ATB (NNAL) and driver install files, Python package metadata.

One parser serves the known-deviation version ranges (which ATB release is this?) and run.json's
provenance, so the version a deviation matched and the version a diff prints are the same string.
Everything is best effort: a missing or unreadable file is None, never an exception.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ASCEND_ROOT = Path("/usr/local/Ascend")
#: Overrides the ATB version read from disk (e.g. a build whose version.info is missing).
ATB_VERSION_ENV = "MLA_ATB_VERSION"
#: The one line a run and a report print when the ATB release is unknown, with its fix.
RELEASE_UNKNOWN = (
    f"ATB release unknown (version.info has no version key, e.g. a source build): set {ATB_VERSION_ENV}=<release>, "
    "e.g. 8.3.RC1"
)


def release_unknown_line(messages: Iterable[str]) -> str | None:
    """The one run-level line for every verdict judged without an ATB release (their messages carry
    RELEASE_UNKNOWN), with its fix; None when no verdict needed the release."""
    count = sum(RELEASE_UNKNOWN in message for message in messages)
    if not count:
        return None
    return f"{RELEASE_UNKNOWN}; {count} verdict(s) were judged against every release their expectations name"


_LINE = re.compile(r"^\s*([^=:]+?)\s*[=:]\s*(.*?)\s*$")


def parse_info(text: str) -> dict[str, str]:
    """Parse Ascend ``*.info``/``version.cfg`` files: ``key=value`` or ``key : value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group(1) and not line.lstrip().startswith("#"):
            out.setdefault(match.group(1), match.group(2))
    return out


def version_of(info: dict[str, str]) -> str | None:
    """The entry that names the version ('version', 'Version', 'Ascend-cann-atb Version', ...)."""
    for key in sorted(info, key=len):
        if key.lower().endswith("version"):
            return info[key]
    return None


def read_version_file(path: str | Path) -> dict[str, Any] | None:
    """``{"file", "version", "info"}`` of one install file, or None when absent or empty."""
    try:
        info = parse_info(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return {"file": str(path), "version": version_of(info), "info": info} if info else None


def _read_first(patterns: list[str]) -> dict[str, Any] | None:
    for pattern in patterns:
        for name in sorted(glob.glob(pattern)):
            found = read_version_file(name)
            if found:
                return found
    return None


def atb_version_near(library_path: str | Path) -> str | None:
    """The NNAL/ATB release of a libatb: ``$MLA_ATB_VERSION``, else the ``version.info`` up to 4 levels up."""
    if os.environ.get(ATB_VERSION_ENV):
        return os.environ[ATB_VERSION_ENV]
    folder = Path(os.path.abspath(library_path)).parent
    for _ in range(4):
        found = read_version_file(folder / "version.info")
        if found and found["version"]:
            return str(found["version"])
        folder = folder.parent
    return None


def ascend_versions(root: Path = ASCEND_ROOT, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """CANN toolkit, ATB (NNAL) and driver install files, when present."""
    env = dict(os.environ) if environ is None else environ
    toolkit_homes = [env.get("ASCEND_TOOLKIT_HOME", ""), f"{root}/ascend-toolkit/latest", f"{root}/cann*"]
    toolkit = [f"{h}/*/ascend_toolkit_install.info" for h in toolkit_homes if h]
    toolkit += [f"{h}/ascend_toolkit_install.info" for h in toolkit_homes if h]
    toolkit += [f"{h}/version.cfg" for h in toolkit_homes if h]
    atb: list[str] = []
    if env.get("ATB_HOME_PATH"):
        # ATB_HOME_PATH is .../nnal/atb/<ver>/atb/cxx_abi_N; version.info sits up to two levels up.
        home = Path(env["ATB_HOME_PATH"])
        atb += [str(home / "version.info"), str(home.parent / "version.info"), str(home.parent.parent / "version.info")]
    atb.append(f"{root}/nnal/atb/latest/version.info")
    return {
        "cann_toolkit": _read_first(toolkit),
        "atb": _read_first(atb),
        "driver": _read_first([f"{root}/driver/version.info"]),
    }


def package_version(name: str) -> str | None:
    """An installed distribution's version from its metadata (never imports it); None if absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
