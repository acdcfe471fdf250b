"""Build one case's golden: inputs, float64 reference, emulated baseline and provenance."""

from __future__ import annotations

import os
import platform

import h5py
import numpy as np

from mlaconf.facts.versions import package_version
from mlaconf.golden.building import progress
from mlaconf.golden.building.baseline import emulate_baseline
from mlaconf.golden.building.blocks import BlockInputs, inputs_record, recorded_inputs
from mlaconf.golden.building.cost import sample_of, sampled_flops
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.magnitudes import reference_and_magnitudes, torch_magnitudes
from mlaconf.golden.building.reference import DEVICE_ENV, gemm_library, reference_attention
from mlaconf.golden.building.rows import SAMPLED_REFERENCE, sampled_baseline, sampled_reference
from mlaconf.golden.building.stats import error_stats
from mlaconf.golden.specs.layout import row_valid
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase, RowSample
from mlaconf.golden.store.integrity import BLOCK_GENERATOR, GENERATOR_VERSION


def _version(package: str) -> str:
    return package_version(package) or "absent"


def computed_by(device: str) -> dict[str, str]:
    """The library that computed each stored array: the reference (and its magnitudes) and the
    baseline run their GEMMs in torch's BLAS (:func:`mlaconf.golden.building.reference.gemm`), not numpy's; a
    float32 GEMM's summation order, hence the baseline's last bits, depends on it (docs/golden-files.md)."""
    blas = gemm_library()
    reference = f"float64 GEMMs in {blas}" if device == "cpu" else f"torch {_version('torch')} float64 on {device}"
    return {
        "inputs_computed_by": f"numpy {np.__version__} random Generator, rounded by ml_dtypes {_version('ml_dtypes')}",
        "reference_computed_by": reference,
        "baseline_computed_by": f"float32 GEMMs in {blas}",
    }


def provenance() -> dict[str, str]:
    """Library versions that could change the reference's bits, and which library computed each array."""
    device = os.environ.get(DEVICE_ENV, "cpu")
    return computed_by(device) | {
        "generator_version": GENERATOR_VERSION,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ml_dtypes": _version("ml_dtypes"),
        "h5py": _version("h5py"),
        "hdf5": h5py.version.hdf5_version,
        "platform": platform.platform(),
        "torch": _version("torch"),  # the reference's GEMMs run in torch's BLAS
        "reference_device": device,
    }


def build_golden(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    """Everything the store keeps for a case; deterministic in (spec, seed) (a metamorphic relation's
    transformed inputs are a case of their own, with explicit inputs: golden/building/relations.py)."""
    if spec.sampled:
        return build_sampled(spec, sample_of(spec), threads=threads)
    device = os.environ.get(DEVICE_ENV, "cpu")  # MLA_GOLDEN_DEVICE=cuda: float64 reference on a GPU
    passes = 2.0 if device == "cpu" else 3.0  # tiles of the reference (+ magnitudes), baseline[, magnitudes]
    with progress.case_work(spec.case_id, passes * spec.useful_flops):
        inputs = generate_inputs(spec, threads=threads)
        if device == "cpu":
            progress.set_stage("reference + magnitudes")
            out, magnitudes = reference_and_magnitudes(inputs, spec, threads=threads)
            valid = row_valid(spec)
        else:
            progress.set_stage("reference")
            out, valid = reference_attention(inputs, spec, threads=threads, device=device)
            progress.set_stage("magnitudes")
            magnitudes = torch_magnitudes(inputs, spec, device=device)
        progress.set_stage("baseline")
        baseline = emulate_baseline(inputs, spec, threads=threads)
        progress.set_stage("statistics")
        stats = error_stats(baseline.reshape(out.shape), out, valid, spec.dtype)
    return GoldenCase(
        spec=spec,
        inputs=inputs,
        out=out,
        row_valid=valid,
        baseline_out=baseline,
        baseline_stats=stats.to_dict(),
        provenance=provenance(),
        magnitudes=magnitudes,
    )


def build_sampled(spec: CaseSpec, sample: RowSample, *, threads: int = 1) -> GoldenCase:
    """The golden of ``sample``'s rows of ``spec`` (every head of each; golden/building/rows.py): the float64
    reference and magnitudes of the row kernels on the CPU, the baseline of those rows, its statistics over them.
    Its inputs are drawn by blocks (golden/building/blocks.py): the sampled q rows and, per (batch, kv head), that
    head's keys; the golden keeps their record (seed, generator, digests, hashed over the whole tensors drawn step
    by step), not the tensors.  Deterministic in (spec, sample); a row's reference and magnitudes do not depend
    on the other rows."""
    rows = sample.rows
    source = BlockInputs(spec)
    with progress.case_work(spec.case_id, 2.0 * sampled_flops(spec, rows)):
        progress.set_stage("inputs (sampled rows)")
        queries = (source.gather_queries("q", rows), source.gather_queries("q_rope", rows))
        progress.set_stage("reference + magnitudes (sampled rows)")
        out, magnitudes = sampled_reference(queries, source.keys, spec, rows, threads=threads)
        valid = row_valid(spec)[rows]
        progress.set_stage("baseline (sampled rows)")
        baseline = sampled_baseline(queries, source.keys, spec, rows, threads=threads)
        progress.set_stage("statistics")
        stats = error_stats(baseline.reshape(out.shape), out, valid, spec.dtype)
        record = inputs_record(spec, threads=threads)
    return GoldenCase(
        spec=spec,
        inputs=recorded_inputs(spec),
        out=out,
        row_valid=valid,
        baseline_out=baseline,
        baseline_stats=stats.to_dict(),
        provenance=provenance()
        | {
            "reference_computed_by": SAMPLED_REFERENCE,
            "reference_device": "cpu",
            "inputs_computed_by": f"numpy {np.__version__} PCG64 streams by blocks ({BLOCK_GENERATOR}), rounded "
            f"by ml_dtypes {_version('ml_dtypes')}",
            "inputs_generator": BLOCK_GENERATOR,
        },
        magnitudes=magnitudes,
        sample=sample,
        inputs_record=record,
    )
