"""The statistics of repeated runs, from scipy.stats: a mean with its confidence interval (``CONFIDENCE``,
Student's t), and Welch's t-test of two configurations' runs at ``SIGNIFICANCE``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

from litlab.run.summary import finite

CONFIDENCE = 0.95
SIGNIFICANCE = 0.05  # a difference is significant when Welch's p-value is below this


class Estimate(NamedTuple):
    """The mean of measurements and its 95 % confidence interval (None for fewer than two)."""

    mean: float | None = None
    low: float | None = None
    high: float | None = None


def finite_values(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values`` (a run without the figure, or with nan, is left out)."""
    return [float(v) for v in values if finite(v)]


def estimate(values: Iterable[Any]) -> Estimate:
    """Mean and two-sided 95 % t-interval of the finite ``values``; one value has no interval."""
    sample = finite_values(values)
    if not sample:
        return Estimate()
    mean = math.fsum(sample) / len(sample)
    if len(sample) == 1:
        return Estimate(mean)
    if min(sample) == max(sample):  # no spread: scipy warns and returns nan; the interval is the value
        return Estimate(mean, mean, mean)
    from scipy import stats  # imported on use: the report callback loads in every run

    with warnings.catch_warnings():  # nearly equal values: scipy's precision warning, the result holds
        warnings.simplefilter("ignore", RuntimeWarning)
        interval = stats.ttest_1samp(sample, 0.0).confidence_interval(CONFIDENCE)
    return Estimate(mean, float(interval.low), float(interval.high))


def welch_p_value(sample: Iterable[Any], reference: Iterable[Any]) -> float | None:
    """Two-sided p-value of Welch's t-test that the two samples' means are equal; None when it cannot
    be tested: fewer than two finite values on either side, or no spread on both (scipy gives nan)."""
    a, b = finite_values(sample), finite_values(reference)
    if len(a) < 2 or len(b) < 2:
        return None
    if min(a) == max(a) and min(b) == max(b):
        return None
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p_value = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p_value if math.isfinite(p_value) else None


def significant(p_value: float | None) -> bool | None:
    """Whether a difference exceeds run-to-run noise at ``SIGNIFICANCE``; None when not tested."""
    return None if p_value is None else p_value < SIGNIFICANCE
