"""The statistics lmperf uses on samples, in one place: a metric's samples summarised as the
values of its results row (`summarize`, `summarize_rate`, `summarize_quantiles`), the median and
20%/80% quantiles of a row's samples, the ratio of two runs' medians with an interval, and the
verdict on that ratio.

Quantiles interpolate linearly between order statistics (numpy's default, `method="linear"`),
so the median of an even number of samples is the mean of the middle two, as
`statistics.median` gives.

The interval of a ratio of medians is a percentile bootstrap: each run's samples are resampled
with replacement `RESAMPLES` times (2,000) with a fixed seed (`SEED`), the ratio of the two
resampled medians is taken each time, and the 0.5% and 99.5% quantiles of those ratios bound a
99% interval (99% and not 95% because a results folder holds thousands of timing rows: at 95%,
noise alone would put one row in forty outside its interval). A bootstrap and not a rank test (Mann-Whitney U) because the question asked of two
runs is "how much faster or slower, and is that more than noise?": a size with an interval, which
a practical threshold can then be held against. A rank test answers only "do the two
distributions differ?" with a p-value; with 100 samples a row it calls a 0.5% shift significant
that no one acts on, and its exact null distribution needs scipy (not a dependency) or tables.
The bootstrap needs only numpy, assumes nothing about the shape of a step-time distribution
(skewed, with the odd slow step), and with a fixed seed gives the same interval on every rerun.
It is only as good as the samples: with fewer than `MIN_SAMPLES` a run's median has too few
distinct resampled values to bound, and the caller falls back to the quantiles.

Rows timed by `triton.testing.do_bench` keep only their median and 20%/80% quantiles, not the
repeats. For them `quantile_ratio` takes the ratio of medians and, as its interval, the ratios of
the two runs' 20%-80% ranges set against each other (B's q20 over A's q80, B's q80 over A's
q20): the interval excludes 1 exactly when the two ranges do not overlap. That range is the
spread of single repeats, wider than the uncertainty of a median of many repeats, so this test
is conservative: it calls a difference only where the middle 60% of the repeats moved apart.

The verdict combines the interval with a practical threshold: a row is slower (faster) only
when its interval lies wholly above (below) 1 *and* its ratio is beyond the threshold. Samples
from one process understate the spread between processes (a fresh process on another machine
of the same model places memory, clocks and kernels differently), so significance alone would
flag differences that a rerun does not reproduce; the threshold alone would flag noise on
noisy rows. Ratios here are ratios of times (B's over A's, above 1 when B is slower); a caller
comparing a rate (TFLOP/s) passes the reciprocal.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, NamedTuple

import numpy as np

from lmperf import csv_schema

RESAMPLES = 2000  # bootstrap resamples a ratio's interval is computed from
LEVEL = 0.99  # the interval's coverage
SEED = 0  # the bootstrap's seed: the same samples give the same interval on every run
MIN_SAMPLES = 5  # fewer samples than this in either run: no bootstrap interval

SAME = "same within noise"
FASTER = "faster"
SLOWER = "slower"
BASES = ("samples", "quantiles", "one value")  # what a verdict's noise estimate came from


class Quantiles(NamedTuple):
    """The median and the 20% / 80% quantiles of a set of samples."""
    median: float
    q20: float
    q80: float


class Ratio(NamedTuple):
    """A ratio with an interval (`low`, `high`); NaN bounds where there is none."""
    ratio: float
    low: float = math.nan
    high: float = math.nan

    def reciprocal(self) -> "Ratio":
        inverse = lambda x: 1 / x if x else math.inf  # a bound of 0: a resampled median of 0
        return Ratio(inverse(self.ratio), inverse(self.high), inverse(self.low))

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def parse_samples(text) -> np.ndarray:
    """The finite per-step values of a results row's `samples` cell (";"-joined); empty for an
    empty or missing cell."""
    if text is None:
        return np.array([])
    if isinstance(text, str):
        values = np.array([float(x) for x in text.split(";") if x.strip()], dtype=float)
    else:  # a cell pandas read as a number: one sample, or NaN for none
        values = np.array([float(text)])
    return values[np.isfinite(values)]


def quantiles(samples) -> Quantiles:
    """Median, 20% and 80% quantiles (linear interpolation) of the samples; NaN for none."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        return Quantiles(math.nan, math.nan, math.nan)
    median, q20, q80 = np.quantile(x, [0.5, 0.2, 0.8])
    return Quantiles(float(median), float(q20), float(q80))


def complete(q: Quantiles, samples) -> Quantiles:
    """`q` (a row's median and quantiles as recorded) with what it lacks taken from the
    samples: the median from one or more, the 20% / 80% quantiles from two or more."""
    x = np.asarray(samples, dtype=float)
    derived = quantiles(x) if x.size else Quantiles(math.nan, math.nan, math.nan)
    if x.size < 2:
        derived = derived._replace(q20=math.nan, q80=math.nan)
    return Quantiles(*(v if math.isfinite(v) else d for v, d in zip(q, derived)))


def bootstrap_medians(samples, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The medians of `resamples` resamples (with replacement, same size) of the samples."""
    x = np.asarray(samples, dtype=float)
    return np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)


def ratio_of_medians(a, b, resamples: int = RESAMPLES, level: float = LEVEL,
                     seed: int = SEED) -> Ratio:
    """median(b) / median(a) with a percentile-bootstrap interval at `level` (module docstring).
    Both sets need at least MIN_SAMPLES samples."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if min(a.size, b.size) < MIN_SAMPLES:
        raise ValueError(f"a bootstrap interval needs at least {MIN_SAMPLES} samples a run "
                         f"(got {a.size} and {b.size})")
    rng = np.random.default_rng(seed)
    ratios = bootstrap_medians(b, resamples, rng) / bootstrap_medians(a, resamples, rng)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return Ratio(float(np.median(b) / np.median(a)), float(low), float(high))


def quantile_ratio(a: Quantiles, b: Quantiles) -> Ratio:
    """b's median over a's, with the overlap interval of their 20%-80% ranges (module
    docstring); NaN bounds if either run lacks its quantiles."""
    ratio = b.median / a.median
    if not all(math.isfinite(v) and v > 0 for v in (a.q20, a.q80, b.q20, b.q80)):
        return Ratio(ratio)
    return Ratio(ratio, b.q20 / a.q80, b.q80 / a.q20)


def verdict(time_ratio: Ratio, threshold: float) -> str:
    """SLOWER, FASTER or SAME for a ratio of times (B's over A's): beyond `threshold` (0.08 is
    8%, the same distance on a log scale both ways) and, where the ratio has an interval, with
    the whole interval on that side of 1. A ratio without an interval is judged on the
    threshold alone."""
    if not threshold > 0:
        raise ValueError(f"threshold must be positive, got {threshold}")
    r, low, high = time_ratio
    if not math.isfinite(r):
        raise ValueError(f"cannot judge a ratio of {r}")
    judged_on_interval = time_ratio.has_interval
    if r > 1 + threshold and (low > 1 or not judged_on_interval):
        return SLOWER
    if r < 1 / (1 + threshold) and (high < 1 or not judged_on_interval):
        return FASTER
    return SAME


class Judgement(NamedTuple):
    """Run B against run A on one metric: the ratio of medians B/A with its interval, the basis
    of that interval (one of BASES) and the verdict."""
    ratio: Ratio
    basis: str
    verdict: str


def judge(a: Quantiles, a_samples, b: Quantiles, b_samples, threshold: float,
          higher_is_better: bool = False) -> Judgement:
    """Compare two runs' values of a metric: a bootstrap interval where both have MIN_SAMPLES
    samples, else the quantile interval where both have 20% / 80% quantiles, else none; then
    `verdict` on the ratio of times (the reciprocal, for a rate). Medians must be positive."""
    if not (a.median > 0 and b.median > 0):
        raise ValueError(f"a ratio needs positive medians, got {a.median} and {b.median}")
    ratio = None
    if min(np.size(a_samples), np.size(b_samples)) >= MIN_SAMPLES:
        with np.errstate(divide="ignore", invalid="ignore"):  # resampled medians of 0
            ratio, basis = ratio_of_medians(a_samples, b_samples), BASES[0]
    if ratio is None or not ratio.has_interval:
        ratio = quantile_ratio(a, b)
        basis = BASES[1] if ratio.has_interval else BASES[2]
    ratio = ratio._replace(ratio=b.median / a.median)  # the rows' own medians, as the page shows
    return Judgement(ratio, basis, verdict(ratio.reciprocal() if higher_is_better else ratio, threshold))


def summarize(metric: str, unit: str, samples: Iterable[float]) -> dict:
    """One tidy row for a metric measured over several steps (per-step values kept): mean, std,
    median, 20% and 80% quantiles of the finite samples. With one sample there is no spread to
    state: std is left empty, not 0."""
    xs = [float(x) for x in samples]
    finite = [x for x in xs if math.isfinite(x)]
    # linear interpolation between order statistics, as numpy's and pandas' quantile
    q = statistics.quantiles(finite, n=5, method="inclusive") if len(finite) > 1 else finite * 4 or [math.nan] * 4
    return {
        "metric": metric, "unit": unit,
        "mean": statistics.fmean(finite) if finite else math.nan,
        "std": statistics.stdev(finite) if len(finite) > 1 else math.nan,
        "median": statistics.median(finite) if finite else math.nan,
        "q20": q[0], "q80": q[3],
        "min": min(finite) if finite else math.nan,
        "max": max(finite) if finite else math.nan,
        "n": len(xs),
        "samples": ";".join(f"{x:.6g}" for x in xs),
        "status": "ok", "message": "",
    }


def summarize_rate(metric: str, unit: str, work: float, step_ms: Iterable[float]) -> dict:
    """One tidy row for a rate (tokens/s, TFLOP/s, MFU) of `work` done in each timed step: the
    per-step rates as samples, and as median and 20% / 80% quantiles the work over the step
    time's median and 80% / 20% quantiles (tokens / median step, not a median of rates)."""
    ms = [float(x) for x in step_ms]
    row = summarize(metric, unit, [work / (x / 1e3) for x in ms])
    step = summarize("", "", ms)
    rate = lambda key: work / (step[key] / 1e3)
    return {**row, "median": rate("median"), "q20": rate("q80"), "q80": rate("q20")}


def summarize_quantiles(metric: str, unit: str, median: float, q20: float, q80: float) -> dict:
    """One tidy row for a timing that `triton.testing.do_bench` summarised as quantiles
    (`bench.timing.do_bench_quantiles`): the median and the 20% / 80% quantiles of its repeats.
    `mean`, `std` and `samples` stay empty (do_bench does not return them); the report reads
    `median` for these rows and shows [q20, q80] as their spread."""
    return {**csv_schema.failure_row("ok", ""), "metric": metric, "unit": unit, "median": float(median),
            "q20": float(q20), "q80": float(q80), "min": math.nan, "max": math.nan, "n": math.nan}
