"""Tolerance policies as data: load ``judge/tolerances.toml``, resolve overrides, judge metrics.

A policy is a list of rules; each rule turns :class:`~mlaconf.judge.metrics.Metrics` (and, for the
baseline-relative rules, the emulated same-dtype baseline's :class:`~mlaconf.golden.building.stats.ErrorStats`)
into :class:`Check` records with a measured value, its bound and ``slack = value / bound``.  Every policy
also runs the implicit ``finite`` rule, so a NaN/Inf in the output fails whatever policy is chosen.  A
check whose inputs are missing (no baseline) fails rather than passes: a verdict must never be vacuous.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from mlaconf.facts.operator import DTYPES, UNIT_ROUNDOFF
from mlaconf.golden.building.stats import ErrorStats
from mlaconf.golden.specs.suites import read_toml
from mlaconf.judge.error_model import ModelResult
from mlaconf.judge.metrics import Element, Metrics
from mlaconf.judge.msprobe import DECIDING, BenchmarkMetrics, ratio
from mlaconf.judge.systematic import Significance

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

#: One check a rule measured: metric, value, bound, note, deciding, and the element it located.
Row = tuple[str, float, float, str, bool, Element | None]
NO_BASELINE = "no emulated baseline to compare with"


def _measure(rule: str, p: dict[str, float], m: Metrics, b: ErrorStats | None, ctx: VerdictContext) -> list[Row]:
    """What ``rule`` measures, with its parameters ``p``, on the metrics ``m``, the baseline's statistics ``b``
    and the context's measurements; a check passes when ``value <= bound`` (NaN never does).  An empty list:
    the context has nothing for the rule to measure (:meth:`Policy.evaluate` decides what that means)."""
    u = UNIT_ROUNDOFF[ctx.dtype]
    match rule:
        case "finite":  # implicit in every policy: no NaN/Inf in the output's valid rows, none in the golden
            golden_bad = m.expected_nan_count + m.expected_inf_count
            note = "golden has NaN/Inf" if golden_bad else ""
            return [
                ("nan_count", m.nan_count, 0, "", True, None),
                ("inf_count", m.inf_count, 0, "", True, None),
                ("golden_nonfinite", golden_bad, 0, note, True, None),
            ]
        case "model":  # every element within the error bound of the documented precision path (judge.error_model)
            if ctx.model is None:
                return [("max_err_over_bound", math.nan, 1.0, "no stored magnitudes to bound with", True, None)]
            r = ctx.model
            note = (
                f"worst |err| {r.error:.3g} vs bound {r.bound:.3g} "
                f"(largest term {max(r.terms, key=r.terms.__getitem__)}; "
                f"{r.n_over} of {r.n_elements} elements over, lam {r.lam:.2f})"
                if r.terms
                else r.where
            )
            return [("max_err_over_bound", r.max_ratio, 1.0, note, True, r.element)]
        case "atb":
            size = ctx.head_num * ctx.max_seq + 4
            small = size < p["size_limit"]
            note = f"e for heads*max_seq+4 = {size} {'<' if small else '>='} {p['size_limit']:g}"
            eps = p["eps_small"] if small else p["eps_large"]
            return [("atb_max_scaled_err", m.atb_max_scaled_err, eps, note, True, None)]
        case "benchmark" if b is not None:
            small = m.n_elements < p["min_elements"]  # a ratio of two means over so few elements decides nothing
            rows: list[Row] = []
            for name, value, base, floor in (
                ("mare", m.max_rel_err, b.max_rel_err, p["mare_floor_u"] * u),
                ("mere", m.mean_rel_err, b.mean_rel_err, p["mere_floor_u"] * u),
                ("rmse", m.rmse, b.rmse, p["rmse_floor_u"] * u * m.rms_expected),
            ):
                base = max(base, floor) if math.isfinite(base) else math.nan  # a broken baseline's ratio fails
                # an exact value is 0, a broken one inf, a zero base inf
                quotient = (
                    0.0 if value == 0.0 else math.inf if not math.isfinite(value) or base == 0.0 else value / base
                )
                note = f"{name} {value:.3g} / baseline {base:.3g}"
                if small:
                    note += f"; {m.n_elements} elements < min_elements {p['min_elements']:g}: not deciding"
                rows.append((f"{name}_ratio", quotient, p[name], note, not small, None))
            return rows
        case "thousandth":
            return [("frac_beyond_thousandth", m.frac_beyond_thousandth, p["max_fraction"], "", True, None)]
        case "ulp":
            return [("max_ulp_err", m.max_ulp_err, p["max_ulp"], "", True, None)]
        case "relative" if b is not None:
            floor = p["floor_u"] * u * m.max_abs_expected
            bound = p["k"] * b.max_abs_err + floor if math.isfinite(b.max_abs_err) else math.nan
            note = f"{p['k']:g} x baseline {b.max_abs_err:.3g} + floor {floor:.3g}"
            return [("max_abs_err", m.max_abs_err, bound, note, True, None)]
        case "benchmark" | "relative":  # no baseline: fails rather than pass
            names = ("mare_ratio", "mere_ratio", "rmse_ratio") if rule == "benchmark" else ("max_abs_err",)
            return [(name, math.nan, math.nan, NO_BASELINE, True, None) for name in names]
        case "systematic":
            # evidence on every verdict, deciding only when significant at ``false_alarm`` (split between the
            # two tests) and material (the effect at its floor): a ``<test>_z`` and a ``<test>_effect`` check
            # each, both deciding or neither.  They can only fail a verdict (ONLY_FAILS).
            rows = []
            for t in ctx.systematic or ():
                rows.append((f"{t.name}_z", t.z, t.critical, t.text, t.significant, None))
                rows.append((f"{t.name}_effect", t.effect, t.floor, "materiality floor", t.significant, None))
            return rows
        case "msprobe":
            # each deciding metric of the output over the same metric of the emulated baseline (msprobe's
            # trusted platform), the baseline's floored at ``minimum_err``, within the threshold of the same
            # name; the error balance (``eb``) recorded without a bound (msprobe leaves it out of its status).
            # Non-finite elements drop out of msprobe's metrics: the implicit ``finite`` rule fails them.
            if ctx.msprobe is None:
                return []
            scores, trusted_scores = ctx.msprobe
            rows = []
            for name in (*DECIDING, "eb"):
                value, trusted = getattr(scores, name), getattr(trusted_scores, name)
                bound = p[name] if name in DECIDING else math.inf
                note = f"{name} {value:.3g} / baseline {trusted:.3g}"
                rows.append(
                    (f"{name}_ratio", ratio(value, trusted, p["minimum_err"]), bound, note, name in DECIDING, None)
                )
            return rows
    raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(RULE_PARAMS)}")


#: Rules that can only fail a verdict, so measuring nothing passes nothing; any other deciding rule that
#: measures nothing (a context without the output) fails: a verdict is never vacuous.
ONLY_FAILS = frozenset({"systematic"})


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

        The verdict names one worst element: the one the worst deciding check located (the error model's
        largest error/bound ratio), else the largest scaled error of the metrics."""
        if context.dtype not in DTYPES:
            raise ValueError(f"context dtype must be one of {DTYPES}, got {context.dtype!r}")
        checks: list[Check] = []
        for rule in ("finite", *self.rules, *self.evidence):
            p = {name: self.param(rule, name, context.dtype) for name in self.params.get(rule, {})}
            deciding = rule == "finite" or rule in self.rules
            rows = _measure(rule, p, metrics, baseline, context)
            if not rows and deciding and rule not in ONLY_FAILS:
                rows = [("measured", math.nan, 1.0, "the context has no output to measure", True, None)]
            checks += [  # ``value <= bound``: a NaN value fails (``not value > bound`` would pass it)
                Check(rule, metric, float(value), float(bound), bool(value <= bound), note, deciding and decides, worst)
                for metric, value, bound, note, decides, worst in rows
            ]
        worst, worst_slack = None, -math.inf
        for check in checks:
            if check.decisive and check.worst is not None:
                slack = check.slack if not math.isnan(check.slack) else math.inf
                if slack > worst_slack:  # strictly: the first of equal slacks stays
                    worst, worst_slack = check.worst, slack
        passed = all(c.passed for c in checks if c.decisive)
        return Verdict(
            self.name, passed, checks, self.overrides, worst if worst is not None else metrics.worst_element()
        )


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
