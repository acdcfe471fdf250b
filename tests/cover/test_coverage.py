"""The factor model (facts/factors.toml), case classification and t-way coverage (golden/coverage/levels.py), the
``mlaconf coverage``; the generated covering sections are checked in tests/nocover/test_covering.py."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlaconf.facts.factors import FactorModelError, load_model, parse_model
from mlaconf.golden.coverage.levels import (
    KERNEL_PAIRS,
    PER_BATCH,
    Validity,
    batch_rows,
    case_levels,
    coverage,
    describe,
    kernel_factor_sets,
    kernel_tuples,
    realizable_rows,
)
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.spec_build import build_case

MODEL = load_model()
ROOT = Path(__file__).resolve().parents[2]


def case(**fields: Any) -> Any:
    return build_case({"q_seqlen": [64], "head_num": 1, **fields}, source="test")


def test_every_level_of_the_model_has_a_rule_and_no_rule_is_unnamed() -> None:
    for factor, rules in PER_BATCH.items():
        assert tuple(rules) == MODEL.factor(factor).level_names
    assert all(level.why for factor in MODEL.factors for level in factor.levels)


def test_levels_of_a_case_batch_by_batch() -> None:
    spec = case(mask_type="causal", kv_layout="padded", q_seqlen=[1, 0, 513], kv_seqlen=[608, 16, 1025], head_num=6,
                kv_head_num=2, structure={"v_mean": 4.0})  # fmt: skip
    levels = case_levels(spec)
    assert levels["q_len"] == {"one", "mod128_1", "gt512", "single_tile", "mod16_tail", "mod128_1_long"}
    # 608 and 1025 (the empty batch has no row); 1025 ends on a one-key stack
    assert levels["kv_len"] == {"mult16_not64", "not_mult16", "several_blocks", "stack_tail_short"}
    assert levels["prefix"] == {"long", "mult128"}  # 607 and 512
    assert levels["batch"] == {"many", "empty_row"}
    assert levels["group"] == {"3"} and levels["kv_heads"] == {"two"}
    assert levels["inputs"] == {"random", "v_mean"}
    assert case_levels(case(distribution="near_tie"))["inputs"] == {"near_tie"}


def test_realizable_rows_follow_kv_equals_q_plus_prefix() -> None:
    rows = {row[:3] for row in realizable_rows()}
    assert ("one", "mult512", "zero") not in rows  # kv = q = 1
    assert ("one", "mult512", "long") in rows  # q 1 over 511 cached keys
    assert ("mod128_0", "mult128_not512", "zero") in rows
    assert ("lt16", "ge4096", "zero") not in rows


def test_a_batch_holds_the_input_structure_only_when_its_keys_can_show_it() -> None:
    """A tie needs two keys, a sink a key beside it, a late maximum a key past its start: a batch of one key (or of
    keys all before the late start) holds no such level, and nor does a tuple pairing it with that batch's lengths."""
    ties = case(distribution="near_tie", q_seqlen=[1, 5], kv_seqlen=[1, 5], kv_layout="padded")
    assert [row["inputs"] for row in batch_rows(ties)] == [frozenset(), {"near_tie"}]
    assert case_levels(case(distribution="near_tie", q_seqlen=[1]))["inputs"] == frozenset()
    late = {"logits": "late_max", "rise": 16.0, "late_from": 200}
    spec = case(mask_type="causal", kv_layout="padded", q_seqlen=[8, 8], kv_seqlen=[200, 201], structure=late)
    assert [row["inputs"] for row in batch_rows(spec)] == [frozenset(), {"late_max"}]
    sinks = {"logits": "sinks", "rise": 7.0, "sink_keys": 1}
    spec = case(q_seqlen=[1, 2], kv_layout="padded", structure=sinks)
    assert [row["inputs"] for row in batch_rows(spec)] == [frozenset(), {"sinks"}]
    check = Validity(MODEL)
    assert not check.valid((("inputs", "late_max"), ("kv_len", "single_block")))  # at most 128 keys
    assert not check.valid((("mask", "undefined"), ("q_len", "one"), ("inputs", "near_tie")))  # q = kv = 1
    assert check.valid((("mask", "causal"), ("q_len", "one"), ("inputs", "near_tie")))  # one row over a prefix


def test_each_kernel_meets_every_tiling_pair() -> None:
    """facts/factors.toml's kernel table: dtype x mask with each pair of q_len, kv_len and prefix, counted apart;
    long rows (kv_len ge4096) with each kernel once, in no pair."""
    assert kernel_factor_sets(MODEL) == [
        ("dtype", "mask", "q_len", "kv_len"),
        ("dtype", "mask", "q_len", "prefix"),
        ("dtype", "mask", "kv_len", "prefix"),
        ("dtype", "mask", "kv_len"),
    ]
    wanted = kernel_tuples(MODEL)
    long_rows = [t for t in wanted if ("kv_len", "ge4096") in t]
    assert sorted(long_rows) == sorted(
        (("dtype", d), ("mask", m), ("kv_len", "ge4096"))
        for d in ("fp16", "bf16")
        for m in ("undefined", "mask_free", "causal")
    )
    assert all(len(t) == 4 for t in wanted if t not in long_rows) and len(set(wanted)) == len(wanted)
    fp16 = [case(mask_type="causal", kv_layout="padded", q_seqlen=[129], kv_seqlen=[300])]
    found = {c.label: c for c in coverage(fp16, (2,))}
    missing = {describe(t) for t in found[KERNEL_PAIRS].uncovered}
    assert "no case with dtype bf16 and mask causal and q_len mod128_1 and kv_len not_mult16" in missing
    assert "no case with dtype fp16 and mask causal and q_len mod128_1 and kv_len not_mult16" not in missing
    bf16 = case(dtype="bf16", mask_type="causal", kv_layout="padded", q_seqlen=[129], kv_seqlen=[300])
    more = {c.label: c for c in coverage([*fp16, bf16], (2,))}[KERNEL_PAIRS]
    assert "no case with dtype bf16 and mask causal and q_len mod128_1 and kv_len not_mult16" not in {
        describe(t) for t in more.uncovered
    }
    assert more.total == found[KERNEL_PAIRS].total and len(more.uncovered) < len(found[KERNEL_PAIRS].uncovered)


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        ({"kernel": ["color"], "factors": ["mask", "dtype"]}, "kernel #0: kernel must list 1 or more of"),
        ({"kernel": ["mask"], "factors": ["dtype"]}, "kernel #0: factors must list 2 or more of"),
        ({"kernel": ["mask"], "factors": ["mask", "dtype"]}, r"\['mask'\] both pick the kernel and are tiled by"),
        ({"kernel": ["mask"], "factors": ["dtype", "q"], "once": ["mask.a"]}, "once names 'factor.level' of a tiled"),
        ({"kernel": ["mask"], "factors": ["dtype", "q"], "once": ["q.c"]}, "once names 'factor.level' of a tiled"),
    ],
)
def test_a_broken_kernel_table_is_one_clear_error(kernel: dict[str, Any], message: str) -> None:
    levels = [{"name": "a", "why": "w"}, {"name": "b", "why": "w"}]
    factors = [{"name": n, "scope": "case", "why": "w", "levels": levels} for n in ("mask", "dtype", "q")]
    with pytest.raises(FactorModelError, match=message):
        parse_model({"factor": factors, "kernel": [{"name": "k", "why": "w", **kernel}]}, "m.toml")


def test_constraints_are_the_validators(tmp_path: Path) -> None:
    """Each declared constraint names a combination the suite validator refuses (one home: docs/operator.md)."""
    refused = {
        ("mask", "group"): dict(mask_type="undefined", head_num=4, kv_head_num=2),
        ("mask", "prefix"): dict(mask_type="mask_free", kv_seqlen=[65]),
        ("mask", "kv_layout"): dict(mask_type="causal", kv_layout="packed"),
        ("group", "kv_heads"): dict(mask_type="causal", kv_layout="padded", head_num=256, kv_head_num=2),
        ("mask", "mask_fill"): dict(mask_type="undefined", mask_fill="neg_inf"),
    }
    declared = {(c.when[0], f) for c in MODEL.constraints for f, _ in c.then}
    assert set(refused) <= declared
    for fields in refused.values():
        with pytest.raises(SpecError):
            case(**fields)


def test_no_shipped_case_holds_what_a_constraint_forbids() -> None:
    """The constraints beyond the validator's (levels that derive from the same numbers: heads and tasks, kv layout,
    padding and batch order, inputs and the logit level) hold for every batch of every shipped case: the classifier
    never gives a case a tuple the model calls invalid."""
    from mlaconf.golden.coverage.levels import batch_rows
    from mlaconf.golden.specs.suites import load_suites

    broken = set()
    for spec in load_suites(["smoke", "standard", "edge", "branches"]):
        for row in batch_rows(spec) if spec.expect_error is None else []:
            for c in MODEL.constraints:
                factor, when = c.when
                if row[factor] & when:
                    broken |= {(spec.name, f) for f, allowed in c.then if not row[f] <= allowed}
    assert broken == set()


def test_a_broken_model_file_is_one_clear_error() -> None:
    with pytest.raises(FactorModelError, match="unknown factor 'color'"):
        parse_model(
            {
                "factor": [
                    {
                        "name": "mask",
                        "scope": "case",
                        "why": "w",
                        "levels": [{"name": "a", "why": "w"}, {"name": "b", "why": "w"}],
                    }
                ],
                "constraint": [{"when": {"color": ["red"]}, "then": {"mask": ["a"]}, "why": "w"}],
            },
            "m.toml",
        )


def test_validity_is_exactly_what_some_full_assignment_holds() -> None:
    """Witnesses and refutation by an invalid part are shortcuts: a tuple is valid exactly when a full assignment
    that breaks no constraint holds it, whichever strength is asked first (the constraints chain x -> p -> u -> m ->
    not x, so a = x is invalid though no constraint forbids it alone)."""
    names = {"a": "xyz", "b": "pqr", "c": "uv", "d": "mn"}
    factors = [
        {"name": n, "scope": "case", "why": "w", "levels": [{"name": lv, "why": "w"} for lv in levels]}
        for n, levels in names.items()
    ]
    chain = [("a", "x", "b", ["p"]), ("b", "p", "c", ["u"]), ("c", "u", "d", ["m"]), ("d", "m", "a", ["y", "z"])]
    rules = [{"when": {w: [lv]}, "then": {f: allowed}, "why": "w"} for w, lv, f, allowed in chain]
    model = parse_model({"factor": factors, "constraint": rules}, "m.toml")
    every = [dict(zip(names, levels, strict=True)) for levels in itertools.product(*names.values())]
    full = [a for a in every if model.allows(a)]
    for strengths in ((1, 2, 3), (3, 2, 1)):
        check = Validity(model)
        for t in strengths:
            for chosen in itertools.combinations(names, t):
                for levels in itertools.product(*(names[f] for f in chosen)):
                    items = tuple(zip(chosen, levels, strict=True))
                    held = any(all(a[f] == lv for f, lv in items) for a in full)
                    assert check.valid(items) == held, items
    assert not Validity(model).valid((("a", "x"),)) and Validity(model).valid((("a", "y"), ("b", "p")))


def test_coverage_counts_valid_tuples_and_names_the_missing_ones() -> None:
    cases = [case(mask_type="causal", kv_layout="padded", head_num=6, kv_head_num=1, kv_seqlen=[200])]
    one_way, two_way, _ = coverage(cases, (1, 2))
    assert ("group", "6") not in {t[0] for t in one_way.uncovered}
    missing = {describe(t) for t in two_way.uncovered}
    assert "no case with mask causal and group 7" in missing
    assert "no case with group 6 and q_len one" in missing
    assert "no case with mask undefined and group 6" not in missing  # invalid: not counted
    more = coverage(
        [*cases, case(mask_type="causal", kv_layout="padded", head_num=7, kv_head_num=1, q_seqlen=[1], kv_seqlen=[1])],
        (2,),
    )[0]
    assert len(more.uncovered) < len(two_way.uncovered) and two_way.total == more.total


def test_coverage_verb_refuses_a_missing_file_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    done = subprocess.run(
        [sys.executable, "-m", "mlaconf", "coverage", "--cases", str(missing)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and str(missing) in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_coverage_verb_module_imports_light() -> None:
    code = "import sys, mlaconf.tools.verbs; print(sorted({'torch', 'h5py', 'ml_dtypes'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"


def _coverage_json(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "mlaconf", "coverage", "--json", "--show", "0", *args],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    document: list[dict[str, Any]] = json.loads(done.stdout)
    return document


def test_coverage_per_backend_counts_only_the_cases_it_answers() -> None:
    """--backend drops the cases a known deviation for that backend refuses or fails (at any release): on atb every
    CAUSAL case (the C interface's slot count) and the padded kv it misreads; torch-cpu answers every case; a
    backend named by import path is matched by the name its records carry."""
    from mlaconf.golden.specs.suites import load_suites
    from mlaconf.judge.deviations import load_deviations

    edge = [s for s in load_suites(["edge"]) if s.expect_error is None]
    (plain,) = _coverage_json("edge", "--t", "1")
    (atb,) = _coverage_json("edge", "--t", "1", "--backend", "atb")
    (cpu,) = _coverage_json("edge", "--t", "1", "--backend", "torch-cpu")
    assert cpu["cases"] == plain["cases"] == atb["valid_cases"] == len(edge) and cpu["not_answered"] == {}
    deviations = load_deviations()
    expected: dict[str, int] = {}
    for spec in edge:
        entry = deviations.unanswered("atb", spec)
        if entry is not None:
            expected[entry.id] = expected.get(entry.id, 0) + 1
    assert atb["not_answered"] == expected and expected["atb-c-causal-in-tensor-num"] == sum(
        s.mask_type == 3 for s in edge
    )
    assert atb["cases"] == len(edge) - sum(expected.values()) and atb["selection"] == "edge on atb"
    one_way = {c["label"]: c for c in atb["coverage"]}["1-way"]
    assert {"mask": "causal"} in [u["levels"] for u in one_way["uncovered"]]
    (zoo,) = _coverage_json("branches", "--t", "1", "--backend", "mlaconf.harness.zoo:atb_fp16")
    assert zoo["backend"] == "zoo-atb_fp16" and zoo["not_answered"] == {"zoo-fp16-score-path-raw-overflow": 2}


def test_coverage_per_backend_refuses_what_names_no_backend() -> None:
    for args, words in ((["--backend", "atbb"], "unknown backend 'atbb'"), (["--complete"], "needs --backend")):
        done = subprocess.run(
            [sys.executable, "-m", "mlaconf", "coverage", "edge", *args], capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_covering_generator_can_target_what_one_backend_answers() -> None:
    """With ``accept``, the generator builds only accepted cases (a refused one is rebuilt without one choice at a
    time) and sets aside the tuples no accepted case holds instead of failing."""
    from mlaconf.golden.coverage.covering import Generator

    model = MODEL.settled()
    wanted = [
        (("dtype", "bf16"), ("kv_layout", "padded")),
        (("mask", "causal"), ("kv_layout", "padded")),
        (("mask", "undefined"), ("kv_layout", "padded")),
    ]
    padded_not_causal = lambda spec: spec.kv_layout == "padded" and spec.mask_type != 3  # noqa: E731
    generator = Generator(model, wanted, [], "t", accept=padded_not_causal)
    made = generator.run()
    assert made and all(padded_not_causal(spec) for spec in made)
    assert generator.unreachable == [(("mask", "causal"), ("kv_layout", "padded"))]
    with pytest.raises(RuntimeError, match="no valid case covers"):  # without accept, a tuple no case holds fails
        Generator(model, [(("mask", "causal"), ("kv_layout", "packed"))], [], "t").run()
