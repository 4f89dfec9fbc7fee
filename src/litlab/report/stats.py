"""Statistics of repeated runs (scipy.stats): a mean with its Student's t confidence interval, and
Welch's t-test of two configurations' runs."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

from litlab.run.summary import finite

CONFIDENCE = 0.95
SIGNIFICANCE = 0.05  # a difference is significant when Welch's p-value is below this


class _Estimate(NamedTuple):
    mean: float | None = None
    low: float | None = None  # the interval's ends: None for fewer than two values
    high: float | None = None


def _finite_values(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if finite(v)]  # a run without the figure, or with nan, is left out


def estimate(values: Iterable[Any]) -> _Estimate:
    """Mean and two-sided ``CONFIDENCE`` t-interval of the finite ``values``."""
    sample = _finite_values(values)
    if not sample:
        return _Estimate()
    mean = math.fsum(sample) / len(sample)
    if len(sample) == 1:
        return _Estimate(mean)
    if min(sample) == max(sample):  # no spread: scipy warns and returns nan; the interval is the value
        return _Estimate(mean, mean, mean)
    from scipy import stats  # imported on use: the report callback loads in every run

    with warnings.catch_warnings():  # nearly equal values: scipy's precision warning, the result holds
        warnings.simplefilter("ignore", RuntimeWarning)
        interval = stats.ttest_1samp(sample, 0.0).confidence_interval(CONFIDENCE)
    return _Estimate(mean, float(interval.low), float(interval.high))


def welch_p_value(sample: Iterable[Any], reference: Iterable[Any]) -> float | None:
    """Two-sided p-value of Welch's t-test that the means are equal; None where it cannot be tested."""
    a, b = _finite_values(sample), _finite_values(reference)
    if len(a) < 2 or len(b) < 2 or (min(a) == max(a) and min(b) == max(b)):  # scipy would give nan
        return None
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p_value = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p_value if math.isfinite(p_value) else None
