"""``mlaconf regen | verify | show | list | store``: the golden store from the command line.

Cases are chosen by suite name (positional; ``all`` = every shipped suite but ``errors``) and/or
``--cases FILE`` (a TOML suite file).  The store is ``--out DIR``, else ``$MLA_GOLDEN_DIR``, else
``.golden`` in the working directory.  ``--builder pkg.mod:func`` (hidden) swaps the golden builder, for tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlaconf.facts.cluster import ClusterUnavailable, connected, node_resources
from mlaconf.facts.processes import INTERRUPTED
from mlaconf.golden import verbs
from mlaconf.golden.building import cost
from mlaconf.golden.building import regen as rg
from mlaconf.golden.building.progress import flops_text
from mlaconf.golden.building.relations import suite_cases
from mlaconf.golden.specs.layout import kv_shape, out_shape
from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.suites import available_suites, suite_path
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.h5file import FileMeta, read_golden, read_meta
from mlaconf.golden.store.integrity import GoldenStoreError


def _select(args: argparse.Namespace, default_all: bool, bundles_to: Path | None = None) -> list[CaseSpec] | None:
    suites = list(args.suites) or (["all"] if default_all and not args.cases else [])
    if not suites and not args.cases:
        return None
    return rg.select_cases(suites, args.cases, args.shard, bundles_to)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def store_problem(store: GoldenStore) -> str | None:
    """Why the store's path cannot be a store (it is a file): one line, not one failure per case."""
    if store.root.exists() and not store.root.is_dir():
        return f"golden store {store.root} is not a directory (--out/--golden-dir or $MLA_GOLDEN_DIR names a file)"
    return None


def regen_threads(todo: Sequence[CaseSpec], jobs: int) -> tuple[int, int]:
    """(jobs, builder threads per job) as :func:`mlaconf.golden.building.regen.regen` will use them."""
    jobs = max(1, min(jobs, len(todo)))
    return jobs, max(1, rg.cpu_count() // jobs)


def fit_here(
    store: GoldenStore,
    todo: Sequence[CaseSpec],
    jobs: int,
    *,
    force: bool = False,
    memory: int | None = None,
    threads: int | None = None,
) -> cost.Fit:
    """The cases to be built judged against ``memory`` (default: this host's) and the store's free
    disk, with regen's threads per job unless given.  A case whose file exists is presumed current
    (the worker checks it) unless it would be refused and is not current: an oversize case built
    elsewhere into a shared store is not refused here."""
    jobs, regen_threads_per_job = regen_threads(todo, jobs)
    threads = regen_threads_per_job if threads is None else threads
    memory = cost.host_memory_bytes() if memory is None else memory
    disk = cost.free_disk_bytes(store.root)

    def needs_room(spec: CaseSpec) -> bool:
        path = store.path_for(spec)
        if force or not path.exists():
            return True
        refused = cost.check_fit([spec], memory=memory, disk=disk, threads=threads).refused
        return bool(refused) and not _current(store, path, spec)

    pending = [spec for spec in todo if needs_room(spec)]
    return cost.check_fit(pending, memory=memory, disk=disk, jobs=jobs, threads=threads)


def _warn_fit(fit: cost.Fit, verb: str) -> None:
    for line in fit.warnings:
        print(f"{verb}: warning: {line}", file=sys.stderr)


def cmd_regen(args: argparse.Namespace) -> int:
    store = GoldenStore(args.out)
    if problem := store_problem(store):
        return _fail(problem)
    try:  # the relations' transformed sides get their input bundles in the store they are built in
        specs = _select(args, default_all=True, bundles_to=store.root) or []
    except SpecError as exc:
        return _fail(str(exc))
    if args.jobs < 1:
        return _fail("--jobs must be >= 1")
    todo = [s for s in specs if s.expect_error is None]
    if args.ray is not None:
        if args.jobs != 1:
            return _fail("--jobs does not apply with --ray: the cluster's CPUs and memory decide")
        try:
            with connected(args.ray) as ray:
                return regen_on_cluster(ray, args, specs, store)
        except ClusterUnavailable as exc:
            return _fail(str(exc))
    fit = fit_here(store, todo, args.jobs, force=args.force)
    if fit.refused and not args.allow_oversize:
        for case_id, why in fit.refused.items():
            print(f"error: case {case_id}: {why}", file=sys.stderr)
        return _fail(
            f"{len(fit.refused)} case(s) cannot be generated on this host; nothing was built "
            "(--allow-oversize forces them)"
        )
    _warn_fit(fit, "regen")
    print(
        f"regen: {len(specs)} cases -> {store.root} (jobs {args.jobs}); all of them: "
        f"{flops_text(sum(cost.golden_flops(s) for s in todo))} useful, "
        f"~{cost.human_bytes(sum(cost.stored_bytes(s) for s in todo))} on disk, "
        f"peak ~{cost.human_bytes(max((cost.peak_bytes(s) for s in todo), default=0))} per worker",
        file=sys.stderr,
    )
    summary = rg.regen(specs, store, jobs=args.jobs, force=args.force, builder=args.builder)
    print(summary.format())
    if summary.interrupted:
        return INTERRUPTED
    return 1 if summary.count("failed") else 0


def regen_on_cluster(ray: Any, args: argparse.Namespace, specs: Sequence[CaseSpec], store: GoldenStore) -> int:
    """``regen --ray``: the fit judged against the cluster's largest node, then one task per case."""
    from mlaconf.golden.building import ray_regen

    todo = [s for s in specs if s.expect_error is None]
    try:
        shape = ray_regen.ClusterShape.of(node_resources(ray))
    except ValueError as exc:
        return _fail(str(exc))
    fit = fit_here(store, todo, 1, force=args.force, memory=shape.largest_memory, threads=1)  # no node holds it
    if fit.refused and not args.allow_oversize:
        for case_id, why in fit.refused.items():
            print(f"error: case {case_id}: {why.replace('this host', 'the largest Ray node')}", file=sys.stderr)
        return _fail(f"{len(fit.refused)} case(s) fit on no node of the cluster; nothing was built (--allow-oversize)")
    _warn_fit(fit, "regen")
    cpus = sum(float(n.get("CPU", 0.0)) for n in node_resources(ray))
    print(
        f"regen: {len(specs)} cases -> {store.root} on Ray ({cpus:g} CPUs, store {args.ray_store}); "
        f"{flops_text(sum(cost.golden_flops(s) for s in todo))} useful, "
        f"~{cost.human_bytes(sum(cost.stored_bytes(s) for s in todo))} on disk",
        file=sys.stderr,
    )
    summary = ray_regen.regen_on_ray(ray, specs, store, force=args.force, builder=args.builder, mode=args.ray_store)
    print(summary.format())
    if summary.interrupted:
        return INTERRUPTED
    return 1 if summary.count("failed") else 0


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        specs = _select(args, default_all=False)
    except SpecError as exc:
        return _fail(str(exc))
    store = GoldenStore(args.out)
    if problem := store_problem(store):
        return _fail(problem)
    report = rg.verify(store, specs, recompute=args.recompute, builder=args.builder)
    print(report.format())
    if not report.checked:
        missing = "" if store.root.is_dir() else " (no such directory)"
        print(f"verify: no golden files selected in {store.root}{missing}", file=sys.stderr)
    return 1 if report.problems or not report.checked else 0


def _sampled_text(spec: CaseSpec, full: CaseSpec) -> str:
    """A sampled case's sample beside what its golden of every row would cost (nothing for a full case)."""
    if not spec.sampled or spec.expect_error is not None:
        return ""
    return (
        f"sampled {cost.golden_rows(spec)} of {spec.total_q} rows (every row: {flops_text(full.useful_flops)}, "
        f"~{cost.human_bytes(cost.stored_bytes(full))}, peak ~{cost.human_bytes(cost.peak_bytes(full))}; inputs "
        f"drawn by blocks, {cost.human_bytes(2 * cost.input_elements(spec))} whole on a run's host)  "
    )


def cmd_list(args: argparse.Namespace) -> int:
    try:
        specs = _select(args, default_all=True) or []
    except SpecError as exc:
        return _fail(str(exc))
    if args.jobs < 1:
        return _fail("--jobs must be >= 1")
    store = GoldenStore(args.out)
    if problem := store_problem(store):
        return _fail(problem)
    fit = fit_here(store, [s for s in specs if s.expect_error is None], args.jobs)
    valid = 0
    flops = disk = peak = full_flops = full_disk = 0
    for spec in specs:
        state = "error-case" if spec.expect_error else _state(store, spec)
        if spec.case_id in fit.refused:
            state = f"REFUSED here: {fit.refused[spec.case_id]}"
        valid += state == "ok"
        path = store.path_for(spec)
        size = path.stat().st_size if path.exists() else cost.stored_bytes(spec)
        size_text = ("" if path.exists() else "~") + cost.human_bytes(size)
        work = cost.golden_flops(spec)
        flops, disk, peak = flops + work, disk + size, max(peak, cost.peak_bytes(spec))
        full = cost.full_case(spec)
        full_flops, full_disk = full_flops + full.useful_flops, full_disk + cost.stored_bytes(full)
        print(
            f"{spec.case_id}  q{list(out_shape(spec))} kv{list(kv_shape(spec))}  "
            f"{flops_text(work)}  {size_text}  peak ~{cost.human_bytes(cost.peak_bytes(spec))}  "
            f"{_sampled_text(spec, full)}{state}"
        )
    sampled = sum(spec.sampled for spec in specs)
    full_text = (
        f" ({sampled} sampled; every row of every case: {flops_text(full_flops)}, ~{cost.human_bytes(full_disk)})"
        if sampled
        else ""
    )
    print(
        f"total: {len(specs)} cases, {flops_text(flops)} useful, {cost.human_bytes(disk)} on disk, "
        f"peak ~{cost.human_bytes(peak)} per worker (largest case){full_text}"
    )
    if args.suites:  # each named suite's t-way coverage of the factor model (mlaconf coverage lists the gaps)
        from mlaconf.golden.coverage.report import suite_coverage_lines

        print("\n".join(suite_coverage_lines(args.suites)))
    print(f"list: {len(specs)} cases, {valid} with a valid golden in {store.root}", file=sys.stderr)
    _warn_fit(fit, "list")
    if fit.refused:
        print(
            f"list: {len(fit.refused)} case(s) too large to generate on this host (regen refuses them "
            "unless --allow-oversize)",
            file=sys.stderr,
        )
        return 1
    return 0


def _state(store: GoldenStore, spec: CaseSpec) -> str:
    try:
        store.load(spec)
    except GoldenStoreError as exc:
        return f"{type(exc).__name__.removeprefix('Golden').removesuffix('Error').lower()}: {exc.reason}"
    return "ok"


def _suite_specs(extra_files: Sequence[str]) -> dict[str, list[CaseSpec]]:
    """Every shipped suite's cases with the sides its relations judge (and each --cases file's), by suite name."""
    suites = {name: suite_cases(suite_path(name)) for name in available_suites()}
    for path in extra_files:
        suites[str(path)] = suite_cases(Path(path))
    return suites


def cmd_store(args: argparse.Namespace) -> int:
    store = GoldenStore(args.out)
    if problem := store_problem(store):
        return _fail(problem)
    try:
        suites = _suite_specs(args.cases)
    except SpecError as exc:
        return _fail(str(exc))
    files = store.files()
    sizes = {path.name: path.stat().st_size for path in files}
    referenced: set[str] = set()
    print(f"store: {store.root}: {len(files)} files, {cost.human_bytes(sum(sizes.values()))}")
    print(f"{'suite':24s} {'cases':>5s} {'present':>7s} {'stale':>5s} {'on disk':>10s} {'all built':>10s}")
    for name, specs in suites.items():
        names = {f"{s.case_id}.h5": s for s in specs if s.expect_error is None}
        referenced |= set(names)
        present = [n for n in names if n in sizes]
        stale = sum(1 for n in present if not _current(store, store.root / n, names[n]))
        estimate = sum(cost.stored_bytes(s) for s in names.values())
        print(
            f"{name:24s} {len(names):5d} {len(present):7d} {stale:5d} "
            f"{cost.human_bytes(sum(sizes[n] for n in present)):>10s} {'~' + cost.human_bytes(estimate):>10s}"
        )
    orphans = [path for path in files if path.name not in referenced]
    orphans += sorted(store.root.glob(".*.tmp"))
    orphan_bytes = sum(path.stat().st_size for path in orphans)
    print(f"unreferenced: {len(orphans)} files, {cost.human_bytes(orphan_bytes)} (no suite above names them)")
    if not args.prune:
        return 0
    for path in orphans:
        print(f"{'delete' if args.yes else 'would delete'} {path.name} ({cost.human_bytes(path.stat().st_size)})")
        if args.yes:
            path.unlink(missing_ok=True)
    if not args.yes and orphans:
        print("dry run: add --yes to delete these files")
    return 0


def _current(store: GoldenStore, path: Path, spec: CaseSpec) -> bool:
    """The file is intact enough to read its attributes and was written for this spec and version."""
    try:
        store.check_stale(read_meta(path), spec)
    except GoldenStoreError:
        return False
    return True


def find_files(store: GoldenStore, query: str) -> list[Path]:
    """Files whose case id or content hash starts with ``query`` (an exact case id wins)."""
    matches = []
    for path in store.files():
        if path.stem == query:
            return [path]
        if path.stem.startswith(query) or path.stem.rsplit("-", 1)[-1].startswith(query):
            matches.append(path)
            continue
        try:
            if read_meta(path).content_hash.startswith(query):
                matches.append(path)
        except GoldenStoreError:
            continue
    return matches


def _describe(name: str, arr: np.ndarray, spec: CaseSpec) -> str:
    """One line: name, dtype, shape, finite value range, count of NaN/Inf."""
    tag = arr.dtype.name if arr.dtype.kind in "biu" or arr.dtype == np.float64 else spec.dtype
    values = arr.astype(np.float64)
    finite = values[np.isfinite(values)]
    span = f"[{finite.min():.6g}, {finite.max():.6g}]" if finite.size else "[]"
    extra = f"  non-finite {values.size - finite.size}" if finite.size != values.size else ""
    return f"  {name:18s} {tag:8s} {list(arr.shape)!s:22s} range {span}{extra}"


def cmd_show(args: argparse.Namespace) -> int:
    store = GoldenStore(args.out)
    if problem := store_problem(store):
        return _fail(problem)
    matches = find_files(store, args.case)
    if len(matches) != 1:
        found = ", ".join(p.stem for p in matches) or "none"
        return _fail(f"{args.case!r} matches {len(matches)} golden files in {store.root}: {found}")
    path = matches[0]
    try:
        golden, meta = read_golden(path)
    except GoldenStoreError as exc:
        print(f"CORRUPT {exc}")
        return 1
    print(f"file: {path} ({path.stat().st_size / 1e6:.2f} MB, checksums ok)")
    print(f"case: {golden.spec.case_id} (suite {golden.spec.suite or '-'}, {golden.spec.source or '-'})")
    print(f"content_hash: {meta.content_hash}")
    print("spec:\n  " + golden.spec.to_toml().strip().replace("\n", "\n  "))
    print("datasets:")
    record = golden.inputs_record
    for name, arr in golden.inputs.arrays().items():
        if record is not None and name in record.digests:  # drawn again by blocks, not stored
            print(
                f"  inputs/{name:11s} not stored: drawn by {record.generator} from seed {record.seed}, xxh3-128 "
                f"{record.digests[name]}"
            )
        else:
            print(_describe(f"inputs/{name}", arr, golden.spec))
    print(_describe("golden/out", golden.out, golden.spec))
    print(_describe("baseline/out", golden.baseline_out, golden.spec))
    print(f"row_valid: {int(golden.row_valid.sum())} of {golden.row_valid.size} rows")
    if golden.sample is not None:
        reasons = ", ".join(f"{name} {count}" for name, count in golden.sample.counts().items())
        print(f"sample: {golden.sample.rows.size} of {golden.spec.total_q} token rows ({reasons})")
    print("baseline stats:")
    for key, value in sorted(golden.baseline_stats.items()):
        print(f"  {key} = {value}")
    _print_provenance(meta, golden.provenance)
    return 0


def _print_provenance(meta: FileMeta, provenance: dict[str, str]) -> None:
    print("provenance:")
    skip = {"spec_json", "checksums_json", "provenance_json", "blas"}
    for key, value in sorted(meta.attrs.items()):
        if key not in skip:
            print(f"  {key} = {value}")
    blas = json.loads(str(meta.attrs.get("blas", "{}")))  # numpy's build: computes none of the stored arrays
    for key in ("blas", "lapack"):
        if isinstance(blas.get(key), dict):
            print(f"  numpy's {key} = {blas[key].get('name', '?')} {blas[key].get('version', '')}".rstrip())
    for key, value in sorted(provenance.items()):
        print(f"  builder.{key} = {value}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the golden verbs alone (``python -m mlaconf.golden.maintain``), without the other areas' verbs."""
    parser = argparse.ArgumentParser(prog="golden", description=__doc__)
    verbs.register(parser.add_subparsers(dest="verb", required=True, metavar="VERB"))
    args = parser.parse_args(argv)
    try:
        return int(globals()[args.func.partition(":")[2]](args))  # verbs names each verb's function here
    except KeyboardInterrupt:  # outside regen's own handling (e.g. while cases are selected)
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
