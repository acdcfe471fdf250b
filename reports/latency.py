"""Latency of two runs compared, pair by pair and across the board (:mod:`mlaconf.reports.diff` uses it): what a
shared host's load cannot fool.

A pair is compared only where both runs recorded at least :data:`MIN_REPEATS` timed calls. Each call is
divided by the host calibration timed around it where both sides have one (``timing.calibration_ms``: a burst
of load slows both alike). A call whose calibration is off its side's median by more than :data:`BURST` caught
a burst the call may not have (or the reverse) and is set aside; when more than :data:`MAX_BURST_SHARE` of a
side's calls are, the host was too noisy and the pair is "not compared: host noisy". A side is then its
fastest :func:`fastest_k` calls and its median. The candidate is slower when a one-sided Mann-Whitney U test
(scipy) is significant at family-wise level :data:`ALPHA` over all compared pairs (Holm-Bonferroni) and both
its fastest calls and its median got slower by more than the latency threshold; a side whose calls deviate
from their median by more than :data:`NOISY_DEVIATION` is "not compared: host noisy" too. :class:`HostShift` says what
the pairs show as a whole: a host slower throughout (once, never case by case), and kernels slower across the
board (a perf regression a loaded host cannot drown).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from mlaconf.reports.aggregate import number
from mlaconf.reports.records import Record


class CaseLatency(Protocol):
    """What the latency verdict reads and sets on a pair of records (reports.diff's ``CaseDiff``)."""

    case_id: str
    backend: str
    latency: str
    latency_ratio: float | None


#: Fewest timed calls per side before latencies are compared at all: with n calls a side the
#: smallest one-sided p is 1 / C(2n, n) (5.4e-6 at n = 10), so a slowdown can stay significant
#: after the Holm correction over up to ~1,800 compared pairs.
MIN_REPEATS = 10
#: Fewest uncalibrated pairs whose common fastest-call ratio is taken for the whole run's (a host
#: or toolkit slower throughout) rather than for each pair's own.
MIN_RUN_WIDE = 5
#: Family-wise significance level of the one-sided Mann-Whitney U tests "the candidate is slower".
ALPHA = 0.01
#: A calibration more than this factor off its side's median (either way) marks its call as burst-hit.
BURST = 1.5
#: Largest share of a side's calls that may be burst-hit before its latencies say nothing.
MAX_BURST_SHARE = 0.25
#: Largest deviation (median absolute deviation over median) of a side's calibrated calls: beyond it about half
#: the calls met load the calibration did not follow, and no figure of the pair means anything.  (A few calls
#: slowed, or most of them alike, keep it small: the fastest calls and the median then still say something.)
NOISY_DEVIATION = 0.25


@dataclass
class PerfDiff:
    case_id: str
    backend: str
    base_ms: float
    cand_ms: float
    #: p-value of the one-sided Mann-Whitney U test (candidate slower) and the repeats per side.
    p_value: float | None = None
    repeats: tuple[int, int] = (0, 0)
    #: Candidate over base on the fastest calls (calibrated where both sides were), and what that compared.
    fast_ratio: float | None = None
    basis: str = ""

    @property
    def ratio(self) -> float:
        """The slowdown: on the fastest calls where known, else of the medians."""
        return self.fast_ratio if self.fast_ratio is not None else self.cand_ms / self.base_ms


@dataclass(frozen=True)
class LatencyTest:
    """One pair's per-call latencies compared.

    Each call is divided by the host calibration timed just before it where both sides have one
    (``timing.calibration_ms``: a busy moment slows both alike), else taken raw.  ``fast`` is the
    mean of the fastest :func:`fastest_k` calls of a side, ``mid`` the median; ``noise`` a side's
    spread (interquartile range over median); ``host`` the candidate's median calibration over the
    base's (None: uncalibrated)."""

    base_ms: float
    cand_ms: float
    base_fast: float
    cand_fast: float
    base_mid: float
    cand_mid: float
    p_value: float
    repeats: tuple[int, int]
    k: int
    calibrated: bool
    noise: tuple[float, float]
    host: float | None = None
    #: Why the pair is not judged on its own ("" when it is): its host was too noisy.  Its figures still
    #: count in what the runs show as a whole (:class:`HostShift`), where a median over pairs outlasts noise.
    noisy: str = ""

    def ratio(self) -> float:
        """The candidate over the base on the fastest calls (calibrated where possible)."""
        return self.cand_fast / self.base_fast if self.base_fast > 0 else math.inf

    def slower(self, threshold: float, scale: float = 1.0) -> bool:
        """Slower by more than ``threshold`` times ``scale`` (the run-wide factor of uncalibrated
        pairs) on the fastest calls and on the median: a shift of the whole distribution."""
        limit = threshold * scale
        return self.cand_fast > limit * self.base_fast and self.cand_mid > limit * self.base_mid

    def basis(self) -> str:
        over = "each over its calibration" if self.calibrated else "uncalibrated"
        return f"fastest {self.k} of {self.repeats[0]} / {self.repeats[1]} timed calls, {over}"


def fastest_k(n: int) -> int:
    """How many of a side's fastest calls stand for it: a quarter, at least 3."""
    return min(n, max(3, n // 4))


def _spread(values: Sequence[float]) -> float:
    q1, _, q3 = statistics.quantiles(values, n=4)
    mid = statistics.median(values)
    return (q3 - q1) / mid if mid > 0 else math.inf


def _deviation(values: Sequence[float]) -> float:
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values) / mid if mid > 0 else math.inf


def _series(record: Record, key: str) -> list[float]:
    timing = record.get("timing")
    raw = timing.get(key) if isinstance(timing, Mapping) else None
    return [float(v) for v in raw or [] if number(v) is not None and math.isfinite(float(v))]


def _calm_ratios(
    calls: Sequence[float], calibrations: Sequence[float], burst: float = BURST
) -> tuple[list[float], int]:
    """Each call over its calibration, leaving out the calls whose calibration caught a burst (off the side's
    median by more than ``burst``); and how many were left out."""
    middle = statistics.median(calibrations)
    calm = [(x, y) for x, y in zip(calls, calibrations, strict=True) if middle / burst <= y <= middle * burst]
    return [x / y for x, y in calm], len(calls) - len(calm)


def latency_test(base: Record, cand: Record) -> LatencyTest | str:
    """The pair's latency test, or why it is not compared ("" when neither side was timed)."""
    b, c = _series(base, "latencies_ms"), _series(cand, "latencies_ms")
    if not (isinstance(base.get("timing"), Mapping) or isinstance(cand.get("timing"), Mapping)):
        return ""  # nothing timed (a rejection, a relation, a skip)
    if len(b) < MIN_REPEATS or len(c) < MIN_REPEATS:
        return f"not compared ({len(b)} vs {len(c)} timed calls; needs {MIN_REPEATS} each)"
    from scipy import stats  # only here: the diff's other paths and the plugin never pay its import

    cal_b, cal_c = _series(base, "calibration_ms"), _series(cand, "calibration_ms")
    calibrated = len(cal_b) == len(b) and len(cal_c) == len(c) and min(cal_b + cal_c) > 0
    host = statistics.median(cal_c) / statistics.median(cal_b) if calibrated else None
    noisy = ""
    if calibrated:
        (calm_b, hit_b), (calm_c, hit_c) = _calm_ratios(b, cal_b), _calm_ratios(c, cal_c)
        if hit_b > MAX_BURST_SHARE * len(cal_b) or hit_c > MAX_BURST_SHARE * len(cal_c):
            noisy = (
                f"not compared: host noisy ({hit_b} of {len(cal_b)} base and {hit_c} of {len(cal_c)} candidate "
                f"calibrations off their median by more than {BURST:g}x)"
            )
            calm_b, _ = _calm_ratios(b, cal_b, burst=math.inf)  # every call, for the run-wide figures only
            calm_c, _ = _calm_ratios(c, cal_c, burst=math.inf)
        b, c = calm_b, calm_c
    deviation = (_deviation(b), _deviation(c))
    if not noisy and max(deviation) > NOISY_DEVIATION:
        noisy = (
            f"not compared: host noisy (a case's calls deviate {deviation[0]:.0%} (base) and {deviation[1]:.0%} "
            f"(candidate) from their median, more than {NOISY_DEVIATION:.0%})"
        )
    kb, kc = fastest_k(len(b)), fastest_k(len(c))
    fast_b, fast_c = statistics.fmean(sorted(b)[:kb]), statistics.fmean(sorted(c)[:kc])
    raw_b, raw_c = _series(base, "latencies_ms"), _series(cand, "latencies_ms")
    p = float(stats.mannwhitneyu(c, b, alternative="greater").pvalue)
    return LatencyTest(
        statistics.median(raw_b),
        statistics.median(raw_c),
        fast_b,
        fast_c,
        statistics.median(b),
        statistics.median(c),
        p,
        (len(b), len(c)),
        min(kb, kc),
        calibrated,
        (_spread(b), _spread(c)),
        host,
        noisy,
    )


def holm_significant(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm-Bonferroni step-down: which hypotheses are rejected at family-wise level ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


@dataclass(frozen=True)
class HostShift:
    """What the compared pairs say about the two runs as a whole: the run-wide factor (median over
    pairs) of the calibration (``host``, calibrated pairs) and of the kernels' fastest calls
    (``kernels``, uncalibrated pairs), and the noise seen (median spread of a side)."""

    host: float | None
    kernels: float | None
    calibrated: int
    uncalibrated: int
    noise: tuple[float, float]
    #: Calibrated pairs: the median over pairs of the candidate's median call over the base's.
    calibrated_kernels: float | None = None

    def across_the_board(self, threshold: float) -> str:
        """A kernel slowdown across the board ("" if none): over at least :data:`MIN_RUN_WIDE`
        calibrated pairs the calls' common ratio, over the host calibration's, beyond ``threshold``.
        A median over many cases is what survives a loaded host's noise, which can hide a 2x
        slowdown case by case."""
        k, h = self.calibrated_kernels, self.host
        if k is None or h is None or h <= 0 or self.calibrated < MIN_RUN_WIDE or k / h <= threshold:
            return ""
        return (
            f"the candidate's kernels are slower across the board: their calls took {k:.2f}x as long "
            f"(median over {self.calibrated} pairs) while the host calibration beside them took {h:.2f}x, "
            f"{k / h:.2f}x on the kernels"
        )

    def scale(self, threshold: float) -> float:
        """The factor uncalibrated pairs are judged against: the run-wide one when the whole run
        moved beyond ``threshold`` (a host slower throughout is no case-by-case regression)."""
        k = self.kernels
        broad = self.uncalibrated >= MIN_RUN_WIDE
        return k if broad and k is not None and (k > threshold or k < 1 / threshold) else 1.0

    def notes(self, threshold: float) -> list[str]:
        """The latency comparison in words whose wording matches their numbers."""
        noise = f"noise seen: a case's calls spread {self.noise[0]:.0%} (base) and {self.noise[1]:.0%} (candidate)"
        out = []
        if self.host is not None:
            out.append(
                f"latency: {self.calibrated} pairs compared on their fastest calls, each call over the host "
                f"calibration timed just before it; {noise} (interquartile range / median)"
            )
            if self.host > threshold:
                out.append(
                    f"the candidate's host was slower throughout: its calibration ran {self.host:.2f}x as "
                    f"long over {self.calibrated} pairs; calibrated latencies discount it"
                )
            elif self.host < 1 / threshold:
                out.append(
                    f"the candidate's host was faster throughout: its calibration ran {self.host:.2f}x as "
                    f"long over {self.calibrated} pairs; calibrated latencies discount it"
                )
            else:
                out.append(
                    f"host calibration ratio {self.host:.2f}x over {self.calibrated} pairs: within "
                    f"{threshold:g}x, the hosts ran alike"
                )
        if self.kernels is not None:
            out.append(
                f"latency: {self.uncalibrated} pairs compared on their fastest calls without a calibration "
                f"(runs before it); {noise}"
            )
            k = self.kernels
            if self.scale(threshold) != 1.0:
                way = "slower" if k > 1 else "faster"
                out.append(
                    f"the candidate ran {way} throughout: median fastest-call ratio {k:.2f}x over "
                    f"{self.uncalibrated} uncalibrated pairs, a host or a toolkit {way} across the board "
                    "(no calibration tells which); each case is judged against that ratio, not reported "
                    "one by one; rerun both on one quiet host"
                )
            elif k > threshold or k < 1 / threshold:
                out.append(
                    f"median fastest-call ratio {k:.2f}x over {self.uncalibrated} uncalibrated pairs, too few "
                    f"(< {MIN_RUN_WIDE}) to call it run-wide: each pair is judged on its own"
                )
            else:
                out.append(
                    f"median fastest-call ratio {k:.2f}x over {self.uncalibrated} uncalibrated pairs: "
                    f"within {threshold:g}x, no change across the board"
                )
        return out


def host_shift(tests: Sequence[LatencyTest]) -> HostShift:
    cal = [t for t in tests if t.calibrated and t.host is not None]
    raw = [t for t in tests if not t.calibrated]
    return HostShift(
        statistics.median(t.host for t in cal if t.host is not None) if cal else None,
        statistics.median(t.ratio() for t in raw) if raw else None,
        len(cal),
        len(raw),
        (statistics.median(t.noise[0] for t in tests), statistics.median(t.noise[1] for t in tests)),
        statistics.median(t.cand_ms / t.base_ms for t in cal if t.base_ms > 0) if cal else None,
    )


def judge_latency(
    tests: Sequence[tuple[CaseLatency, LatencyTest]], threshold: float
) -> tuple[list[PerfDiff], HostShift | None]:
    """Set each pair's latency verdict (what was compared, the ratio, the noise); the significant
    slowdowns beyond ``threshold`` (uncalibrated pairs: beyond the run-wide factor too), and what
    the runs say as a whole."""
    if not tests:
        return [], None
    shift = host_shift([t for _, t in tests])
    perf = []
    for d, t in tests:
        if t.noisy:
            d.latency = t.noisy
    judged = [(d, t) for d, t in tests if not t.noisy]  # the family of the Holm correction: pairs compared
    significant = holm_significant([t.p_value for _, t in judged])
    for (d, t), sig in zip(judged, significant, strict=True):
        ratio = t.ratio()
        d.latency_ratio = ratio
        scale = 1.0 if t.calibrated else shift.scale(threshold)
        seen = f"{t.basis()}; median {t.cand_mid / t.base_mid:.2f}x; noise {t.noise[0]:.0%} / {t.noise[1]:.0%}"
        if sig and t.slower(threshold, scale):
            d.latency = f"slower {ratio:.2f}x (p = {t.p_value:.2g}; {seen})"
            perf.append(PerfDiff(d.case_id, d.backend, t.base_ms, t.cand_ms, t.p_value, t.repeats, ratio, t.basis()))
        else:
            why = "" if sig else ", not significant"
            why += f", within the run-wide {scale:.2f}x" if sig and scale != 1.0 else ""
            d.latency = f"unchanged ({ratio:.2f}x, p = {t.p_value:.2g}{why}; {seen})"
    return perf, shift
