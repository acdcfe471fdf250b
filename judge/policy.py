"""Tolerance policies as data: load ``judge/tolerances.toml``, resolve overrides, judge metrics.

A policy is a list of rules; each rule turns :class:`~mlaconf.judge.metrics.Metrics` (and, for the
baseline-relative rules, the emulated same-dtype baseline's :class:`~mlaconf.golden.building.stats.ErrorStats`)
into :class:`Check` records with a measured value, its bound and ``slack = value / bound``.  Every policy
also runs the implicit ``finite`` rule, so a NaN/Inf in the output fails whatever policy is chosen, and, where
the golden holds a row sample, the implicit ``whole_output`` rule (every element finite and within its
visible V range).  A
check whose inputs are missing (no baseline) fails rather than passes: a verdict must never be vacuous.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, NamedTuple

from mlaconf.facts.operator import DTYPES, UNIT_ROUNDOFF
from mlaconf.golden.building.stats import ErrorStats
from mlaconf.golden.specs.suites import read_toml
from mlaconf.judge.error_model import ModelResult
from mlaconf.judge.metrics import Element, Metrics
from mlaconf.judge.msprobe import DECIDING, BenchmarkMetrics, ratio
from mlaconf.judge.systematic import Significance
from mlaconf.judge.whole_output import WholeOutput

DEFAULT_PATH = Path(__file__).resolve().parent / "tolerances.toml"

Param = float | dict[str, float]
Params = dict[str, dict[str, Param]]

#: Every rule and its parameters (all must be given in ``[rules.<name>]``).
RULE_PARAMS: dict[str, tuple[str, ...]] = {
    "model": ("false_alarm", "safety"),
    "atb": ("eps_small", "eps_large", "size_limit"),
    "benchmark": ("mare", "mere", "rmse", "mare_floor_u", "mere_floor_u", "rmse_floor_u", "min_elements"),
    "thousandth": ("max_fraction",),
    "ulp": ("max_ulp",),
    "relative": ("k", "floor_u"),
    "systematic": ("false_alarm",),
    "msprobe": (
        "small_value",
        "small_value_atol",
        "bench_eps",
        "minimum_err",
        "small_value_err_ratio",
        "rmse",
        "max_rel_err",
        "mean_rel_err",
    ),
}
OVERRIDE_SELECTORS = ("policy", "backend", "dtype", "mask", "case")


class PolicyError(ValueError):
    """The tolerance file is malformed; names the file, the table and the field."""

    def __init__(self, source: str, where: str, field_name: str, message: str) -> None:
        self.source, self.where, self.field_name = source, where, field_name
        super().__init__(f"{source}: {where}: field {field_name!r}: {message}")


@dataclass(frozen=True)
class VerdictContext:
    """What a rule needs to know about the case besides the metrics: the case's shape and what was
    measured on the output with the policy's parameters (:func:`mlaconf.judge.verdict.verdict_context`).
    A measurement that is None was not made (metrics alone: no output, or no stored magnitudes)."""

    dtype: str
    head_num: int
    max_seq: int
    #: The error-model rule's largest error/bound ratio (judge.error_model); None: no magnitudes to bound with.
    model: ModelResult | None = None
    #: The systematic-error tests (temperature, format signature; judge.systematic).
    systematic: tuple[Significance, ...] | None = None
    #: msprobe's benchmark metrics of the output and of the emulated baseline against the golden (judge.msprobe).
    msprobe: tuple[BenchmarkMetrics, BenchmarkMetrics] | None = None
    #: The checks of every output element (judge.whole_output): made where the golden holds a row sample.
    whole_output: WholeOutput | None = None


@dataclass(frozen=True)
class Check:
    """One measured value against its bound; ``slack`` > 1 means the bound was exceeded."""

    rule: str
    metric: str
    value: float
    bound: float
    passed: bool
    note: str = ""
    #: False for evidence only: recorded and reported, but not part of the verdict.
    decisive: bool = True
    #: This check's worst element, when its rule locates one (the error model's ratio to its bound);
    #: the verdict then names this element, not a second one by another measure.
    worst: Element | None = dataclasses.field(default=None, compare=False)

    @property
    def slack(self) -> float:
        if self.value == 0.0:
            return 0.0
        if self.bound == 0.0 or not math.isfinite(self.value):
            return math.inf
        return self.value / self.bound

    def text(self) -> str:
        note = f" ({self.note})" if self.note else ""
        evidence = "" if self.decisive else " [evidence, not deciding]"
        return (
            f"{self.rule}: {self.metric} = {self.value:.4g} vs bound {self.bound:.4g} "
            f"(slack {self.slack:.3g}){note}{evidence}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(
            rule=self.rule,
            metric=self.metric,
            value=float(self.value),
            bound=float(self.bound),
            slack=float(self.slack),
            passed=self.passed,
            note=self.note,
            decisive=self.decisive,
        )


@dataclass(frozen=True)
class AppliedOverride:
    """An ``[[override]]`` entry that changed a resolved policy, and why."""

    index: int
    reason: str
    rules: dict[str, dict[str, Param]]

    def to_dict(self) -> dict[str, Any]:
        return dict(index=self.index, reason=self.reason, rules=self.rules)


@dataclass(frozen=True)
class Verdict:
    """The outcome of judging one output under one policy."""

    policy: str
    passed: bool
    checks: list[Check]
    overrides: tuple[AppliedOverride, ...]
    #: The one element the verdict names (:meth:`Policy.evaluate`), None when nothing was checked.
    worst: Element | None

    @property
    def worst_element(self) -> str:
        """The named element in one line, as the failure text says it."""
        return self.worst.text() if self.worst is not None else "no element checked"

    @property
    def failing(self) -> list[Check]:
        """Deciding checks over their bound (evidence-only checks never fail a verdict)."""
        return [c for c in self.checks if c.decisive and not c.passed]

    @property
    def evidence_over(self) -> list[Check]:
        """Evidence-only checks over their bound (reported, not deciding)."""
        return [c for c in self.checks if not c.decisive and not c.passed]

    @property
    def worst_slack(self) -> float:
        """The largest slack among the deciding checks."""
        return max((c.slack for c in self.checks if c.decisive), default=0.0)

    def worst_check(self) -> Check | None:
        return max((c for c in self.checks if c.decisive), key=lambda c: c.slack, default=None)

    def summary(self) -> str:
        """One paragraph: the verdict, the failing checks (or the tightest one) and the worst element."""
        overridden = "".join(f"; override #{o.index}: {o.reason}" for o in self.overrides)
        head = f"{'PASS' if self.passed else 'FAIL'} under policy {self.policy!r}{overridden}. "
        if self.failing:
            body = "Failed " + "; ".join(c.text() for c in self.failing) + ". "
        else:
            worst = self.worst_check()
            body = f"Tightest {worst.text()}. " if worst else ""
        if self.evidence_over:
            body += "Evidence over its bound: " + "; ".join(c.text() for c in self.evidence_over) + ". "
        return f"{head}{body}Worst element: {self.worst_element}."


# -- rules ---------------------------------------------------------------------------------------

NO_BASELINE = "no emulated baseline to compare with"


class Measured(NamedTuple):
    """One value a rule measured, before it is a :class:`Check`: its bound, a note, whether the rule lets it
    decide, and the element it located (the error model's worst ratio)."""

    metric: str
    value: float
    bound: float
    note: str = ""
    deciding: bool = True
    element: Element | None = None

    def as_check(self, rule: str, rule_decides: bool) -> Check:
        """The check of ``rule``: passed when ``value <= bound`` (a NaN value fails, where ``not value > bound``
        would pass it); deciding when both the rule and the measurement decide."""
        passed = bool(self.value <= self.bound)
        decides = rule_decides and self.deciding
        return Check(rule, self.metric, float(self.value), float(self.bound), passed, self.note, decides, self.element)


@dataclass(frozen=True)
class RuleInputs:
    """What a rule reads: its parameters for the case's dtype, the output's metrics, the emulated baseline's
    error statistics (None: no baseline) and the context's measurements."""

    params: dict[str, float]
    metrics: Metrics
    baseline: ErrorStats | None
    context: VerdictContext

    @property
    def unit_roundoff(self) -> float:
        return UNIT_ROUNDOFF[self.context.dtype]


def finite_rule(given: RuleInputs) -> list[Measured]:
    """Implicit in every policy: no NaN/Inf in the output's valid rows, none in the golden."""
    m = given.metrics
    golden_bad = m.expected_nan_count + m.expected_inf_count
    return [
        Measured("nan_count", m.nan_count, 0),
        Measured("inf_count", m.inf_count, 0),
        Measured("golden_nonfinite", golden_bad, 0, "golden has NaN/Inf" if golden_bad else ""),
    ]


def whole_output_rule(given: RuleInputs) -> list[Measured]:
    """Implicit in every policy where the golden holds a row sample: every element of every valid row finite,
    and within the range of its visible V column widened by rounding (judge.whole_output); nothing otherwise."""
    w = given.context.whole_output
    if w is None:
        return []
    return [
        Measured("nonfinite_elements", w.nonfinite, 0, w.nonfinite_note(), True, w.first_nonfinite),
        Measured("v_range_excess", w.excess, 1.0, w.range_note(), True, w.worst),
    ]


def model_rule(given: RuleInputs) -> list[Measured]:
    """Every element within the error bound of the documented precision path (judge.error_model)."""
    r = given.context.model
    if r is None:
        return [Measured("max_err_over_bound", math.nan, 1.0, "no stored magnitudes to bound with")]
    note = (
        f"worst |err| {r.element.error:.3g} vs bound {r.element.bound:.3g} "
        f"(largest term {max(r.terms, key=r.terms.__getitem__)}; "
        f"{r.n_over} of {r.n_elements} elements over, lam {r.lam:.2f})"
        if r.terms and r.element is not None
        else r.where
    )
    return [Measured("max_err_over_bound", r.max_ratio, 1.0, note, True, r.element)]


def atb_rule(given: RuleInputs) -> list[Measured]:
    """ATB's elementwise rule: the largest scaled error within e, chosen by the case's size."""
    p, ctx = given.params, given.context
    size = ctx.head_num * ctx.max_seq + 4
    small = size < p["size_limit"]
    note = f"e for heads*max_seq+4 = {size} {'<' if small else '>='} {p['size_limit']:g}"
    eps = p["eps_small"] if small else p["eps_large"]
    worst = given.metrics.worst  # |err| <= e max(1, |g|) elementwise: its own bound, the rule's slack
    element = None
    if worst is not None:
        bound = eps * max(1.0, abs(worst.expected)) if math.isfinite(worst.expected) else math.nan
        element = dataclasses.replace(worst, located_by="atb:atb_max_scaled_err", bound=bound)
    return [Measured("atb_max_scaled_err", given.metrics.atb_max_scaled_err, eps, note, True, element)]


def benchmark_rule(given: RuleInputs) -> list[Measured]:
    """Each of MARE, MERE and RMSE over the emulated baseline's, the baseline's floored; not deciding over fewer
    than ``min_elements`` (a ratio of two means over so few elements decides nothing)."""
    p, m, b, u = given.params, given.metrics, given.baseline, given.unit_roundoff
    if b is None:
        return _without_baseline(("mare_ratio", "mere_ratio", "rmse_ratio"))
    small = m.n_elements < p["min_elements"]
    rows = []
    for name, value, base, floor in (
        ("mare", m.max_rel_err, b.max_rel_err, p["mare_floor_u"] * u),
        ("mere", m.mean_rel_err, b.mean_rel_err, p["mere_floor_u"] * u),
        ("rmse", m.rmse, b.rmse, p["rmse_floor_u"] * u * m.rms_expected),
    ):
        base = max(base, floor) if math.isfinite(base) else math.nan  # a broken baseline's ratio fails
        note = f"{name} {value:.3g} / baseline {base:.3g}"
        if small:
            note += f"; {m.n_elements} elements < min_elements {p['min_elements']:g}: not deciding"
        rows.append(Measured(f"{name}_ratio", _quotient(value, base), p[name], note, not small))
    return rows


def _quotient(value: float, base: float) -> float:
    """``value / base``, where an exact value is 0, and a broken value or a zero base inf."""
    return 0.0 if value == 0.0 else math.inf if not math.isfinite(value) or base == 0.0 else value / base


def thousandth_rule(given: RuleInputs) -> list[Measured]:
    """The fraction of elements whose relative error is beyond the dtype's thousandth."""
    return [Measured("frac_beyond_thousandth", given.metrics.frac_beyond_thousandth, given.params["max_fraction"])]


def ulp_rule(given: RuleInputs) -> list[Measured]:
    """The largest distance in the dtype's ULPs."""
    return [Measured("max_ulp_err", given.metrics.max_ulp_err, given.params["max_ulp"])]


def relative_rule(given: RuleInputs) -> list[Measured]:
    """The largest absolute error within ``k`` times the baseline's plus a floor of the golden's magnitude."""
    p, m, b = given.params, given.metrics, given.baseline
    if b is None:
        return _without_baseline(("max_abs_err",))
    floor = p["floor_u"] * given.unit_roundoff * m.max_abs_expected
    bound = p["k"] * b.max_abs_err + floor if math.isfinite(b.max_abs_err) else math.nan
    note = f"{p['k']:g} x baseline {b.max_abs_err:.3g} + floor {floor:.3g}"
    return [Measured("max_abs_err", m.max_abs_err, bound, note)]


def _without_baseline(metrics: tuple[str, ...]) -> list[Measured]:
    """A baseline-relative rule without a baseline: fails rather than passes."""
    return [Measured(name, math.nan, math.nan, NO_BASELINE) for name in metrics]


def systematic_rule(given: RuleInputs) -> list[Measured]:
    """Evidence on every verdict, deciding only when significant at ``false_alarm`` (split between the two
    tests) and material (the effect at its floor): a ``<test>_z`` and a ``<test>_effect`` check each, both
    deciding or neither.  They can only fail a verdict (ONLY_FAILS)."""
    rows = []
    for t in given.context.systematic or ():
        rows.append(Measured(f"{t.name}_z", t.z, t.critical, t.text, t.significant))
        rows.append(Measured(f"{t.name}_effect", t.effect, t.floor, "materiality floor", t.significant))
    return rows


def msprobe_rule(given: RuleInputs) -> list[Measured]:
    """Each deciding metric of the output over the same metric of the emulated baseline (msprobe's trusted
    platform), the baseline's floored at ``minimum_err``, within the threshold of the same name; the error
    balance (``eb``) recorded without a bound (msprobe leaves it out of its status).  Non-finite elements
    drop out of msprobe's metrics: the implicit ``finite`` rule fails them."""
    if given.context.msprobe is None:
        return []
    p = given.params
    scores, trusted_scores = given.context.msprobe
    rows = []
    for name in (*DECIDING, "eb"):
        value, trusted = getattr(scores, name), getattr(trusted_scores, name)
        bound = p[name] if name in DECIDING else math.inf
        note = f"{name} {value:.3g} / baseline {trusted:.3g}"
        rows.append(Measured(f"{name}_ratio", ratio(value, trusted, p["minimum_err"]), bound, note, name in DECIDING))
    return rows


#: What each rule measures: a check passes when ``value <= bound`` (NaN never does).  An empty list: the
#: context has nothing for the rule to measure (:meth:`Policy.evaluate` decides what that means).
RULES: dict[str, Callable[[RuleInputs], list[Measured]]] = {
    "finite": finite_rule,
    "whole_output": whole_output_rule,
    "model": model_rule,
    "atb": atb_rule,
    "benchmark": benchmark_rule,
    "thousandth": thousandth_rule,
    "ulp": ulp_rule,
    "relative": relative_rule,
    "systematic": systematic_rule,
    "msprobe": msprobe_rule,
}


#: Rules that can only fail a verdict, so measuring nothing passes nothing; any other deciding rule that
#: measures nothing (a context without the output) fails: a verdict is never vacuous.
ONLY_FAILS = frozenset({"systematic", "whole_output"})
#: Rules every policy runs, first, and that always decide.
IMPLICIT = ("finite", "whole_output")


@dataclass(frozen=True)
class Policy:
    """A resolved policy: its rules, their parameters and the overrides that shaped them."""

    name: str
    description: str
    rules: tuple[str, ...]
    params: Params
    overrides: tuple[AppliedOverride, ...] = ()
    #: Rules measured and recorded on every verdict without deciding it.
    evidence: tuple[str, ...] = ()

    def param(self, rule: str, name: str, dtype: str) -> float:
        """A rule's parameter for ``dtype`` (a per-dtype table gives the dtype's value)."""
        value = self.params[rule][name]
        return float(value[dtype]) if isinstance(value, dict) else float(value)

    def evaluate(self, metrics: Metrics, baseline: ErrorStats | None, context: VerdictContext) -> Verdict:
        """Judge ``metrics`` (backend vs golden) given the baseline's error statistics (baseline vs golden).

        The verdict names one worst element: the one furthest beyond its own bound by the worst deciding check
        that bounds single elements (model: the largest error/bound ratio; atb: the largest scaled error), else
        the metrics' largest scaled error, without a bound (the policy bounds no single element)."""
        if context.dtype not in DTYPES:
            raise ValueError(f"context dtype must be one of {DTYPES}, got {context.dtype!r}")
        checks = [
            check
            for rule in (*IMPLICIT, *self.rules, *self.evidence)
            for check in self._checks(rule, metrics, baseline, context)
        ]
        passed = all(c.passed for c in checks if c.decisive)
        named = _located_element(checks)
        return Verdict(self.name, passed, checks, self.overrides, named if named is not None else metrics.worst)

    def _checks(self, rule: str, metrics: Metrics, baseline: ErrorStats | None, context: VerdictContext) -> list[Check]:
        """What ``rule`` measured, as checks: evidence-only unless the policy decides by it (the implicit rules
        always do); a deciding rule that measured nothing fails, unless it can only fail (a verdict is never
        vacuous)."""
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(RULE_PARAMS)}")
        params = {name: self.param(rule, name, context.dtype) for name in self.params.get(rule, {})}
        deciding = rule in IMPLICIT or rule in self.rules
        measured = RULES[rule](RuleInputs(params, metrics, baseline, context))
        if not measured and deciding and rule not in ONLY_FAILS:
            measured = [Measured("measured", math.nan, 1.0, "the context has no output to measure")]
        return [m.as_check(rule, deciding) for m in measured]


def _located_element(checks: list[Check]) -> Element | None:
    """The element the worst deciding check located (NaN slack counts as infinite; the first of equal
    slacks stays), None when no deciding check located one."""
    worst, worst_slack = None, -math.inf
    for check in checks:
        if check.decisive and check.worst is not None:
            slack = check.slack if not math.isnan(check.slack) else math.inf
            if slack > worst_slack:
                worst, worst_slack = check.worst, slack
    return worst


# -- loading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Override:
    index: int
    selectors: dict[str, str]
    rules: dict[str, dict[str, Param]]
    reason: str


@dataclass(frozen=True)
class PolicySet:
    """Every policy of a tolerance file plus its overrides."""

    source: str
    policies: dict[str, Policy]
    overrides: tuple[_Override, ...] = ()

    def __repr__(self) -> str:
        """Short: test reports (hypothesis's failing-example line, in CI) print fixtures by repr."""
        return f"PolicySet({self.source!r}: {', '.join(self.policies)}; {len(self.overrides)} overrides)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """The same short text for pretty-printers (hypothesis's), which would list every field."""
        printer.text(repr(self))

    def resolve(self, policy_name: str, backend: str, dtype: str, mask_name: str, case_id: str) -> Policy:
        """The named policy with every matching override applied in file order."""
        if policy_name not in self.policies:
            raise PolicyError(
                self.source, "<resolve>", "policy", f"no policy named {policy_name!r}; have {sorted(self.policies)}"
            )
        base = self.policies[policy_name]
        subject = dict(policy=policy_name, backend=backend, dtype=dtype, mask=mask_name, case=case_id)
        params: Params = {rule: dict(values) for rule, values in base.params.items()}
        applied = []
        for ov in self.overrides:
            if all(fnmatchcase(subject[key], pattern) for key, pattern in ov.selectors.items()):
                for rule, values in ov.rules.items():
                    for name, value in values.items():
                        params[rule][name] = _merge(params[rule][name], value)
                applied.append(AppliedOverride(ov.index, ov.reason, ov.rules))
        return Policy(base.name, base.description, base.rules, params, tuple(applied), base.evidence)


def _merge(old: Param, new: Param) -> Param:
    """An override's value; a per-dtype table over a per-dtype table changes only its keys."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **new}
    return new


def _number(value: Any, source: str, where: str, name: str) -> float:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (is_number and value > 0 and math.isfinite(value)):
        raise PolicyError(source, where, name, f"must be a positive finite number or a per-dtype table, got {value!r}")
    return float(value)


def _param(value: Any, source: str, where: str, name: str, partial: bool) -> Param:
    """A positive number, or a ``{fp16, bf16}`` table of them (``partial``: keys may be missing)."""
    if not isinstance(value, dict):
        return _number(value, source, where, name)
    unknown = set(value) - set(DTYPES)
    if unknown or (not partial and set(value) != set(DTYPES)):
        raise PolicyError(source, where, name, f"a per-dtype table needs exactly the keys {list(DTYPES)}")
    return {k: _number(v, source, where, f"{name}.{k}") for k, v in value.items()}


def _rule_values(raw: Any, source: str, where: str, partial: bool) -> dict[str, dict[str, Param]]:
    if not isinstance(raw, dict):
        raise PolicyError(source, where, "rules", "must be a table of rule -> {parameter = value}")
    out: dict[str, dict[str, Param]] = {}
    for rule, values in raw.items():
        if rule not in RULE_PARAMS:
            raise PolicyError(source, where, f"rules.{rule}", f"unknown rule; known rules: {sorted(RULE_PARAMS)}")
        if not isinstance(values, dict):
            raise PolicyError(source, where, f"rules.{rule}", "must be a table of parameters")
        for name in values:
            if name not in RULE_PARAMS[rule]:
                raise PolicyError(
                    source, where, f"rules.{rule}.{name}", f"unknown parameter; {rule} has {list(RULE_PARAMS[rule])}"
                )
        if not partial:
            for name in RULE_PARAMS[rule]:
                if name not in values:
                    raise PolicyError(source, where, f"rules.{rule}.{name}", "is required")
        out[rule] = {n: _param(v, source, where, f"rules.{rule}.{n}", partial) for n, v in values.items()}
    return out


def _strings(raw: Mapping[str, Any], keys: tuple[str, ...], source: str, where: str) -> dict[str, str]:
    out = {}
    for key in keys:
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise PolicyError(source, where, key, f"must be a non-empty string, got {raw[key]!r}")
            out[key] = raw[key]
    return out


def load_policies(path: Path | None = None) -> PolicySet:
    """Load and validate a tolerance file (default: ``judge/tolerances.toml``)."""
    path = path or DEFAULT_PATH
    source = str(path)
    data = read_toml(path, lambda name, message: PolicyError(source, "<file>", name, message))
    unknown = set(data) - {"rules", "policy", "override"}
    if unknown:
        raise PolicyError(source, "<file>", sorted(unknown)[0], "unknown top-level table")
    params = _rule_values(data.get("rules", {}), source, "[rules]", partial=False)
    policies: dict[str, Policy] = {}
    raw_policies = data.get("policy", {})
    if not isinstance(raw_policies, dict) or not raw_policies:
        raise PolicyError(source, "<file>", "policy", "at least one [policy.<name>] table is required")
    for name, raw in raw_policies.items():
        where = f"policy {name!r}"
        if not isinstance(raw, dict):
            raise PolicyError(source, where, "<table>", "must be a table")
        extra = set(raw) - {"description", "rules", "evidence"}
        if extra:
            raise PolicyError(
                source, where, sorted(extra)[0], "unknown field; expected 'description', 'rules', 'evidence'"
            )
        rules = raw.get("rules")
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise PolicyError(source, where, "rules", f"must be a list of rule names, got {rules!r}")
        evidence = raw.get("evidence", [])
        if not isinstance(evidence, list) or not all(isinstance(r, str) for r in evidence):
            raise PolicyError(source, where, "evidence", f"must be a list of rule names, got {evidence!r}")
        for field_name, names in (("rules", rules), ("evidence", evidence)):
            for rule in names:
                if rule not in params:
                    raise PolicyError(
                        source, where, field_name, f"rule {rule!r} has no [rules.{rule}] table; have {sorted(params)}"
                    )
        if set(rules) & set(evidence):
            raise PolicyError(source, where, "evidence", "a rule either decides or is evidence, not both")
        description = raw.get("description", "")
        if not isinstance(description, str):
            raise PolicyError(source, where, "description", "must be a string")
        all_params = {r: dict(values) for r, values in params.items()}  # so overrides of any rule apply
        policies[name] = Policy(name, description, tuple(rules), all_params, evidence=tuple(evidence))
    overrides = []
    raw_overrides = data.get("override", [])
    if not isinstance(raw_overrides, list):
        raise PolicyError(source, "<file>", "override", "must be an array of tables ([[override]])")
    for index, raw in enumerate(raw_overrides):
        where = f"override #{index}"
        extra = set(raw) - {*OVERRIDE_SELECTORS, "rules", "reason"}
        if extra:
            raise PolicyError(
                source, where, sorted(extra)[0], f"unknown field; expected {[*OVERRIDE_SELECTORS, 'rules', 'reason']}"
            )
        reason = raw.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise PolicyError(source, where, "reason", "a written reason is required")
        selectors = _strings(raw, OVERRIDE_SELECTORS, source, where)
        if "rules" not in raw:
            raise PolicyError(source, where, "rules", "is required (the parameters to change)")
        rules_changed = _rule_values(raw["rules"], source, where, partial=True)
        overrides.append(_Override(index, selectors, rules_changed, reason.strip()))
    return PolicySet(source, policies, tuple(overrides))
