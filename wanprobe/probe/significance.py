"""Significance tests for "do these paths differ?" (pure functions, no numpy/scipy needed).

- Pearson's chi-square test of independence on a k×2 table of (lost, received) counts per path
  (Pearson 1900; Agresti, Categorical Data Analysis, 3rd ed., §3.2): does loss depend on the path?
- The Kruskal-Wallis H test on RTT samples (Kruskal & Wallis 1952, with the tie correction of
  their eq. 1.4): a rank test, so a few huge RTTs do not decide it as they would a t-test.

Both statistics are referred to the chi-square distribution; its survival function is the
regularized upper incomplete gamma function Q(df/2, x/2), computed by the series / continued
fraction pair of Numerical Recipes, 3rd ed., §6.2 (gser / gcf).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-15
_ITMAX = 1000


def gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a), for a > 0, x ≥ 0."""
    if x <= 0:
        return 1.0
    log_pre = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # series for P(a, x), then Q = 1 - P
        term = total = 1.0 / a
        ap = a
        for _ in range(_ITMAX):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    # Lentz's continued fraction for Q(a, x)
    b = x + 1 - a
    c = 1.0 / 1e-300
    d = 1.0 / b
    h = d
    for i in range(1, _ITMAX):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < _EPS:
            break
    return min(1.0, math.exp(log_pre) * h)


def chi2_sf(x: float, df: int) -> float:
    """P(X ≥ x) for X chi-square with ``df`` degrees of freedom."""
    if df <= 0:
        return 1.0
    return gamma_q(df / 2.0, x / 2.0)


@dataclass(frozen=True)
class TestResult:
    method: str
    statistic: float
    df: int
    p_value: float

    def to_json(self) -> dict:
        return {"method": self.method, "statistic": round(self.statistic, 6), "df": self.df,
                "p_value": round(self.p_value, 9)}


def chi2_independence(table: Sequence[Sequence[int]]) -> TestResult:
    """Pearson chi-square test of independence of rows and columns of a count table. Rows or
    columns that are all zero carry no information and are dropped; with fewer than two of
    either left there is nothing to test (statistic 0, p = 1)."""
    rows = [list(r) for r in table if sum(r) > 0]
    if not rows:
        return TestResult("pearson_chi2", 0.0, 0, 1.0)
    cols = [j for j in range(len(rows[0])) if sum(r[j] for r in rows) > 0]
    rows = [[r[j] for j in cols] for r in rows]
    if len(rows) < 2 or len(cols) < 2:
        return TestResult("pearson_chi2", 0.0, 0, 1.0)
    total = sum(map(sum, rows))
    col_sums = [sum(r[j] for r in rows) for j in range(len(cols))]
    stat = 0.0
    for r in rows:
        rs = sum(r)
        for j, obs in enumerate(r):
            exp = rs * col_sums[j] / total
            stat += (obs - exp) ** 2 / exp
    df = (len(rows) - 1) * (len(cols) - 1)
    return TestResult("pearson_chi2", stat, df, chi2_sf(stat, df))


def kruskal_wallis(groups: Sequence[Sequence[float]]) -> TestResult:
    """Kruskal-Wallis H over the non-empty groups, with the correction for ties."""
    groups = [list(g) for g in groups if len(g) > 0]
    n = sum(len(g) for g in groups)
    if len(groups) < 2 or n < 3:
        return TestResult("kruskal_wallis", 0.0, 0, 1.0)
    pooled = sorted((v, gi) for gi, g in enumerate(groups) for v in g)
    rank_sums = [0.0] * len(groups)
    ties = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2.0 + 1.0   # average rank of the tied run
        t = j - i + 1
        ties += t ** 3 - t
        for k in range(i, j + 1):
            rank_sums[pooled[k][1]] += rank
        i = j + 1
    h = 12.0 / (n * (n + 1)) * sum(rs * rs / len(g) for rs, g in zip(rank_sums, groups,
                                                                       strict=True)) - 3 * (n + 1)
    correction = 1.0 - ties / (n ** 3 - n)
    if correction <= 0:   # every value equal: no evidence of a difference
        return TestResult("kruskal_wallis", 0.0, len(groups) - 1, 1.0)
    h /= correction
    df = len(groups) - 1
    return TestResult("kruskal_wallis", h, df, chi2_sf(h, df))
