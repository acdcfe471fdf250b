"""``mlaconf shrink`` and ``mlaconf repro``: from a failing conformance test to what a vendor can act on.

``shrink`` searches for the smallest spec that still fails by the same deciding check on the same
backend (goldens built on the fly); ``repro`` writes a directory that reruns one case without
mlaconf (inputs and golden in one ``.npz``, the call's arguments, the verdict, the environment and a
standalone program on the backend's own stack).  Both try the likely-cause catalogue.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlaconf.facts.processes import INTERRUPTED
from mlaconf.golden.building.blocks import with_inputs
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.layout import kv_starts
from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import validate_case
from mlaconf.golden.specs.suites import available_suites, load_suite, load_suites
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.harness import registry
from mlaconf.harness.backend import Backend, Unsupported
from mlaconf.judge.causes import relative_error
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.metrics import Element
from mlaconf.judge.policy import load_policies
from mlaconf.reports.records import ResultRecord
from mlaconf.runner.conformance import CaseResult, run_case
from mlaconf.runner.identity import conformance_identity

#: A test id's parameters: ``<case id>-<backend>``; a case id ends in its 8-hex content hash.
PARAMS = re.compile(r"^(?P<case>.+?-[0-9a-f]{8})(?:-(?P<backend>.+))?$")
#: The standalone program per backend kind, in tools/repro_templates.
TEMPLATES = {
    "torch": "repro_torch.py.tmpl",
    "plugin": "repro_plugin.py.tmpl",
    "atb": "repro_atb.cpp.tmpl",
    "torch_npu": "repro_torch_npu.py.tmpl",
}
#: The torch_npu routes (harness/npu_ops.py): their repro replays the op calls they made.
TORCH_NPU_ROUTES = ("ring-mla", "npu-fia")
#: The one-line build of the ATB repro against a CANN + NNAL install (their set_env.sh sourced).
ATB_BUILD = (
    'g++ -std=c++17 -O2 repro.cpp -I"$ASCEND_HOME_PATH/include" -I"$ASCEND_HOME_PATH/include/aclnn" '
    '-I"$ATB_HOME_PATH/include" -L"$ASCEND_HOME_PATH/lib64" -L"$ATB_HOME_PATH/lib" -lascendcl -lnnopbase -latb -o repro'
)


class ReproError(Exception):
    """A test id, case or backend that cannot be shrunk or reproduced (one line for the user)."""


@dataclass(frozen=True)
class Attempt:
    """One spec run and judged: whether it failed, and by which deciding check (``rule:metric``)."""

    spec: CaseSpec
    golden: GoldenCase
    result: CaseResult
    #: The conformance test's record of the result (what a run would have recorded).
    record: ResultRecord

    @property
    def failed(self) -> bool:
        return self.result.outcome == "failed"

    @property
    def failing_checks(self) -> list[str]:
        """The deciding checks over their bound as ``rule:metric``, worst first (a non-numeric failure: its kind)."""
        failing = [c for c in self.record.checks if c.get("decisive", True) and not c.get("passed", True)]
        failing.sort(key=lambda c: -float(c.get("slack", 0.0)))
        names = [f"{c['rule']}:{c['metric']}" for c in failing]
        return names or (["contract"] if self.record.failing else [])

    @property
    def cause(self) -> str | None:
        """The likely cause's catalogue name, None when no catalogued mistake explains the output."""
        found = self.record.likely_cause
        return str(found["name"]) if found else None

    @property
    def check(self) -> str:
        """The deciding check: the worst failing one."""
        return next(iter(self.failing_checks), "")


def score_elements(spec: CaseSpec) -> int:
    """Entries of the score matrices Q.K^T over every batch and head: the size a shrink reduces."""
    return spec.head_num * sum(q * kv for q, kv in zip(spec.q_seqlen, spec.kv_seqlen, strict=True))


def resolve(test_id: str, backend: str | None, cases: Path | None) -> tuple[CaseSpec, str]:
    """The case and backend a test id names (``...test_conformance[CASE-BACKEND]``, ``CASE-BACKEND`` or ``CASE``)."""
    inner = (
        test_id[test_id.index("[") + 1 : test_id.rindex("]")] if "[" in test_id and test_id.endswith("]") else test_id
    )
    match = PARAMS.match(inner)
    if match is None:
        raise ReproError(f"test id {test_id!r}: expected a case id (…-<8 hex digits>) optionally followed by -BACKEND")
    name = backend or match.group("backend")
    if not name:
        raise ReproError(f"test id {test_id!r} names no backend: pass --backend NAME")
    if registry.name_problem(name):  # a plug-in's test id carries its own name, not its import path
        raise ReproError(
            f"test id {test_id!r} ends in {name!r}, no built-in backend: for a plug-in backend add "
            "--backend pkg.module:factory (the --mla-backend value of the run)"
        )
    specs = load_suite(cases) if cases else load_suites(available_suites())
    found = [s for s in specs if s.case_id == match.group("case")]
    if not found:
        where = str(cases) if cases else "the shipped suites"
        raise ReproError(f"case {match.group('case')!r} is not in {where} (pass --cases FILE for another suite file)")
    return found[0], name


def attempt(spec: CaseSpec, backend: Backend, policy: str, *, repeat: int = 1) -> Attempt:
    """Build the golden on the fly and judge ``backend`` on it ``repeat`` times; the last failure is kept (a
    sampled golden with its inputs drawn again: the repro writes them)."""
    golden = with_inputs(build_golden(spec))
    policies, deviations = load_policies(), load_deviations()
    result = run_case(golden, backend, policy_set=policies, policy=policy, deviations=deviations, causes_for="all")
    for _ in range(repeat - 1):
        if result.outcome != "failed":
            break
        result = run_case(golden, backend, policy_set=policies, policy=policy, deviations=deviations, causes_for="all")
    return Attempt(spec, golden, result, result.ending.record(conformance_identity(spec, backend.name, policy)))


def _halve(n: int) -> int:
    return max(1, n // 2)


def candidates(spec: CaseSpec) -> Iterator[CaseSpec]:
    """Smaller or simpler variants of ``spec``, biggest cuts first; every one a valid case."""
    base = dataclasses.replace(spec, name="", suite="", source="shrink")
    changes: list[dict[str, Any]] = []
    q, kv = spec.q_seqlen, spec.kv_seqlen
    if spec.batch > 1:
        changes += [{"q_seqlen": (q[b],), "kv_seqlen": (kv[b],)} for b in range(spec.batch)]
        changes += [{"q_seqlen": q[:b] + q[b + 1 :], "kv_seqlen": kv[:b] + kv[b + 1 :]} for b in range(spec.batch)]
    for b in range(spec.batch):
        prefix = kv[b] - q[b]

        def at(values: tuple[int, ...], value: int, b: int = b) -> tuple[int, ...]:
            return (*values[:b], value, *values[b + 1 :])

        if q[b] > 1:  # fewer query rows, same prefix (kv - q) so a causal offset keeps its meaning
            changes.append({"q_seqlen": at(q, _halve(q[b])), "kv_seqlen": at(kv, max(1, _halve(q[b]) + prefix))})
        if prefix > 1:
            changes.append({"kv_seqlen": at(kv, q[b] + prefix // 2)})
        if spec.mask_type == 0 and kv[b] > 1:
            changes.append({"kv_seqlen": at(kv, _halve(kv[b]))})
    h, g = spec.head_num, spec.kv_head_num
    if h > 1 and g > 1 and h % 2 == 0 and g % 2 == 0:
        changes.append({"head_num": h // 2, "kv_head_num": g // 2})
    if h > g and (h // 2) % g == 0 and h // 2 >= g:
        changes.append({"head_num": h // 2})
    if spec.kv_capacity is not None:
        changes.append({"kv_capacity": None})
    if spec.kv_layout != "packed":
        changes.append({"kv_layout": "packed", "kv_capacity": None})
    if spec.q_layout != "3d":
        changes.append({"q_layout": "3d"})
    if spec.distribution != "uniform":
        changes.append({"distribution": "uniform"})
    if spec.structure is not None:
        changes.append({"structure": None})
    seen = {spec.content_hash}
    for change in changes:
        candidate = dataclasses.replace(base, **change)
        if candidate.content_hash in seen:
            continue
        seen.add(candidate.content_hash)
        try:
            validate_case(candidate)
        except SpecError:
            continue
        yield candidate


def shrink(
    first: Attempt,
    backend: Backend,
    policy: str,
    *,
    budget_s: float,
    repeat: int = 1,
    report: Callable[[str], None] = print,
) -> tuple[Attempt, bool]:
    """Greedy search from a failing attempt: the smallest spec on which the original's deciding check still
    fails with the same likely cause; and whether it finished (False: out of time or interrupted, the best
    so far kept)."""
    best, check, cause = first, first.check, first.cause
    deadline = time.monotonic() + budget_s
    tried = 0
    try:
        improved = True
        while improved:
            improved = False
            for candidate in candidates(best.spec):
                if time.monotonic() > deadline:
                    report(f"shrink: time budget of {budget_s:g} s spent after {tried} candidates; best so far kept")
                    return best, False
                tried += 1
                trial = attempt(candidate, backend, policy, repeat=repeat)
                if (
                    trial.failed
                    and check in trial.failing_checks
                    and trial.cause == cause  # a smaller case must not change the diagnosis
                    and score_elements(candidate) <= score_elements(best.spec)
                ):
                    best, improved = trial, True
                    size = score_elements(candidate)
                    report(f"shrink: {tried} tried, now {candidate.readable_id} ({size} score elements)")
                    break
    except KeyboardInterrupt:
        report(f"shrink: interrupted after {tried} candidates; best so far kept")
        return best, False
    return best, True


def _backend(name: str) -> Backend:
    try:
        backend = registry.create(name)
    except registry.BackendSelectionError as exc:
        raise ReproError(str(exc)) from exc
    availability = backend.available()
    if not availability:
        raise ReproError(f"backend {name} unavailable: {availability.reason}")
    return backend


def _start(args: argparse.Namespace) -> tuple[Attempt, Backend, str]:
    spec, name = resolve(args.test_id, args.backend, args.cases)
    backend = _backend(name)
    return attempt(spec, backend, args.policy, repeat=getattr(args, "repeat", 1)), backend, name


def run_shrink(args: argparse.Namespace) -> int:
    try:
        first, backend, name = _start(args)
        if not first.failed:
            print(f"{first.spec.case_id} passes on {name}: nothing to shrink")
            return 0
        if not backend.deterministic and args.repeat < 2:
            raise ReproError(
                f"backend {name} is not deterministic: pass --repeat N (every candidate must fail N times)"
            )
        print(
            f"shrink: {first.spec.case_id} fails on {name} by {first.check}; budget {args.budget:g} s", file=sys.stderr
        )
        best, finished = shrink(
            first,
            backend,
            args.policy,
            budget_s=args.budget,
            repeat=args.repeat,
            report=lambda s: print(s, file=sys.stderr),
        )
    except ReproError as exc:
        print(f"mlaconf shrink: {exc}", file=sys.stderr)
        return 2
    before, after = score_elements(first.spec), score_elements(best.spec)
    print(best.spec.to_toml(), end="")
    print(f"# {before} -> {after} score elements ({after / before:.3g} of the original); {first.check} still fails")
    if best.record.likely_cause:
        print(f"# likely cause: {best.record.likely_cause['text']}")
    return 0 if finished else INTERRUPTED


# -- repro ---------------------------------------------------------------------------------------


def _bits(array: np.ndarray) -> np.ndarray:
    """numpy has no bfloat16: bf16 arrays are stored as their uint16 bit patterns (call.json says so)."""
    return array.view(np.uint16) if array.dtype.itemsize == 2 and array.dtype != np.float16 else array


def element_text(named: Mapping[str, Any] | None) -> str:
    """The element the verdict names, in the failure text's words (:meth:`judge.metrics.Element.text`)."""
    return Element.from_dict(named).text() if named is not None else "none named (no numeric verdict)"


def backend_kind(name: str) -> str:
    """Which standalone program a backend gets: ``atb`` (C++), ``torch_npu`` (the op replayed), ``torch``
    (CPU/CUDA), ``plugin`` (import path)."""
    if name == "atb":
        return "atb"
    if name in TORCH_NPU_ROUTES:
        return "torch_npu"
    if ":" in name:
        return "plugin"
    if name in ("torch-cpu", "torch-cuda", "torch-cpu-strict"):
        return "torch"
    return "plugin"


def write_atb_inputs(
    golden: GoldenCase, spec: CaseSpec, out_dir: Path, named: Mapping[str, Any] | None = None
) -> list[str]:
    """What repro.cpp reads: atb_call.txt (the harness's exact arguments and the element the verdict ``named``)
    and atb_inputs/ (raw bytes per tensor, the float64 golden and one byte per token of row_valid); numpy's zip
    format is no C++ one-liner."""
    from mlaconf.harness.atb import repro_manifest
    from mlaconf.runner.execution import make_call

    lines, data = repro_manifest(make_call(golden.inputs, spec))
    rows = golden.row_valid.shape[0]
    reference = np.ascontiguousarray(golden.out, dtype=np.float64).reshape(rows, -1)
    data.update(golden=reference.tobytes(), row_valid=golden.row_valid.astype(np.uint8).tobytes())
    data.update(golden_rows=golden_rows(golden).tobytes())
    lines.append(f"golden {rows} {reference.shape[1]}")
    if named is not None:  # the element's place in the case and its bound, to print it in the failure text's words
        at = " ".join(str(named[key]) for key in ("batch", "row_in_batch", "token", "head", "column"))
        lines.append(f"named {at} {float(named.get('bound', math.nan))!r} {named['located_by']}")
    inputs = out_dir / "atb_inputs"
    inputs.mkdir(exist_ok=True)
    for name, payload in data.items():
        (inputs / f"{name}.bin").write_bytes(payload)
    (out_dir / "atb_call.txt").write_text("\n".join(lines) + "\n")
    return ["atb_call.txt", "atb_inputs/"]


def _host(value: Any) -> Any:
    return value.detach().to("cpu").clone() if isinstance(value, torch.Tensor) else value


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


def write_npu_calls(backend: Backend, op_name: str, golden: GoldenCase, spec: CaseSpec, out_dir: Path) -> list[str]:
    """What the torch_npu repro replays: the route is run once more with its op wrapped, and every call's
    arguments (on the host, with where each lived), its outputs and the assembly of attenOut go to npu_calls.pt."""
    from mlaconf.harness.npu_ops import op_output_rows
    from mlaconf.runner.execution import make_call

    parent_path, _, attr = op_name.rpartition(".")
    parent: Any = importlib.import_module(parent_path.split(".")[0])
    for part in parent_path.split(".")[1:]:
        parent = getattr(parent, part)
    original = getattr(parent, attr)
    calls: list[dict[str, Any]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        entry = {
            "args": [_host(a) for a in args],
            "args_on_device": [_on_device(a) for a in args],
            "kwargs": {k: _host(v) for k, v in kwargs.items()},
            "kwargs_on_device": {k: _on_device(v) for k, v in kwargs.items()},
            "outputs": [],
        }
        calls.append(entry)
        result = original(*args, **kwargs)
        entry["outputs"] = [_host(r) for r in result]
        return result

    call = make_call(golden.inputs, spec)
    setattr(parent, attr, recording)
    try:
        backend.run(call)
    except Unsupported as exc:
        raise ReproError(f"{op_name}: the route does not run this case ({exc})") from exc
    except Exception:  # an op that raises: the calls up to it (the last one unanswered) are the repro
        if not calls:
            raise
    finally:
        setattr(parent, attr, original)
    unpack_rows, steps = op_output_rows(op_name, call)
    blob = {
        "op": op_name,
        "calls": calls,
        "steps": steps[: len(calls)],
        "unpack_rows": unpack_rows,
        "total_q": int(call.q.shape[0]),
        "head_num": call.head_num,
    }
    torch.save(blob, out_dir / "npu_calls.pt")
    return ["npu_calls.pt"]


def golden_rows(golden: GoldenCase) -> np.ndarray:
    """The token row of each row of the golden (int64): every row, or a sampled golden's rows."""
    rows = golden.token_rows
    return np.arange(golden.spec.total_q, dtype=np.int64) if rows is None else rows.astype(np.int64)


def write_repro(first: Attempt, name: str, out_dir: Path) -> list[str]:
    """Write the repro directory; returns the names of the files written."""
    golden, record, spec = first.golden, first.record, first.spec
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {key: _bits(value) for key, value in golden.inputs.arrays().items()}
    arrays.update(golden=golden.out, row_valid=golden.row_valid, golden_rows=golden_rows(golden))
    np.savez(out_dir / "case.npz", allow_pickle=False, **arrays)
    call = {
        "dtype": spec.dtype,
        "head_num": spec.head_num,
        "kv_head_num": spec.kv_head_num,
        "qk_scale": spec.qk_scale,
        "mask_type": spec.mask_type,
        "cache_mode": spec.cache_mode,
        "q_layout": spec.q_layout,
        "kv_layout": spec.kv_layout,
        "kv_starts": kv_starts(golden.inputs, spec),  # where each batch's keys are in k viewed [rows, Hkv, D]
        "q_seqlen": list(spec.q_seqlen),
        "kv_seqlen": list(spec.kv_seqlen),
        "backend": name,
        "shapes": {key: list(value.shape) for key, value in arrays.items()},
        "layout": "case.npz: the inputs in the C interface's layout (bf16 as uint16 bit patterns), "
        "golden (float64, attenOut's layout, one row per golden_rows entry), golden_rows (int64: the token row of "
        "each golden row: every row, or a sampled golden's), row_valid (bool per golden row: rows the operator "
        "promises)",
    }
    numbers: dict[str, Any] = {}
    if first.result.output is not None:
        output = first.result.output.reshape(spec.total_q, -1)[golden_rows(golden)]
        numbers = {"relative_error": relative_error(output, golden.out, golden.row_valid)}
    verdict = {
        "test": f"test_conformance[{spec.case_id}-{name}]",
        "verdict": record.verdict,
        "check": first.check or None,
        "checks": list(record.checks),
        "failing": list(record.failing),
        "metrics": dict(record.metrics),
        "worst_element": record.worst_element,
        "likely_cause": record.likely_cause,
        "message": record.message,
        "repro_numbers": numbers,
        "spec_toml": spec.to_toml(),
    }
    backend = _backend(name)
    info = backend.info()
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "backend": {"name": info.name, "device": info.device, "version": info.version, "versions": dict(info.versions)},
        "golden_provenance": dict(golden.provenance),
    }
    for file, data in (("call.json", call), ("verdict.json", verdict), ("env.json", env)):
        (out_dir / file).write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    kind = backend_kind(name)
    template = (resources.files("mlaconf.tools") / "repro_templates" / TEMPLATES[kind]).read_text()
    op_name = str(getattr(backend, "op_name", ""))
    program = template.replace("@BACKEND@", name).replace("@BUILD@", ATB_BUILD).replace("@OP@", op_name)
    script = "repro.cpp" if kind == "atb" else "repro.py"
    (out_dir / script).write_text(program)
    extra: list[str] = []
    if kind == "atb":
        extra = write_atb_inputs(golden, spec, out_dir, record.worst_element)
    elif kind == "torch_npu":
        extra = write_npu_calls(backend, op_name, golden, spec, out_dir)
    run_line = {
        "atb": f"{ATB_BUILD} && ./repro",
        "torch": "python repro.py  (needs numpy and torch)",
        "torch_npu": "python repro.py  (needs numpy, torch and torch_npu on an Ascend device)",
        "plugin": f"PYTHONPATH=<where {name.partition(':')[0]} imports from> python repro.py  (needs numpy and torch)",
    }[kind]
    status = "FAILS" if first.failed else f"does not fail ({record.verdict})"
    cause = f"; likely cause: {record.likely_cause['text']}" if record.likely_cause else ""
    (out_dir / "README").write_text(
        f"MLA prefill case {spec.case_id} on {name} {status}: {first.check or 'no failing check'}{cause}.\n"
        f"Worst element: {element_text(record.worst_element)}.\n"
        f"Run: {run_line}; it prints the relative error and the worst element recorded in verdict.json.\n"
        "Files: case.npz (inputs, golden; layout in call.json), call.json (arguments), verdict.json, env.json.\n"
    )
    return ["README", "case.npz", "call.json", "verdict.json", "env.json", script, *extra]


def run_repro(args: argparse.Namespace) -> int:
    try:
        first, _, name = _start(args)
        files = write_repro(first, name, args.out)
    except ReproError as exc:
        print(f"mlaconf repro: {exc}", file=sys.stderr)
        return 2
    if not first.failed:
        print(f"{first.spec.case_id} passes on {name} ({first.result.outcome}): the repro in {args.out} shows a pass")
    else:
        print(f"{first.spec.case_id} fails on {name} by {first.check}: wrote {', '.join(files)} to {args.out}")
        if first.record.likely_cause:
            print(f"likely cause: {first.record.likely_cause['text']}")
    print(f"worst element: {element_text(first.record.worst_element)}")
    return 0
