"""Statistics over per-step values: descriptives, OLS with confidence intervals, bootstrap CIs.

Pure functions of numbers; numpy is imported inside each function. Example::

    >>> round(t_quantile(0.975, 10), 4)
    2.2281
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
from dataclasses import dataclass

BOOTSTRAP_DRAWS = 20_000
BOOTSTRAP_SEED = 1234
CHUNK = 2000        # bootstrap draws resampled per block (kit scheme)


def exact_mean(values) -> float:
    """Correctly rounded mean, equal to ``statistics.mean`` (the published summaries were made that way).

    Every finite float is an integer over a power of two, so the exact sum is one integer over the
    largest denominator, and Python's int / int is correctly rounded: statistics' result without its
    Fraction arithmetic, several times faster.
    """
    values = list(values)
    try:
        ratios = [v.as_integer_ratio() for v in values]
    except (AttributeError, OverflowError, ValueError):      # inf, nan, or not a float/int
        return float(statistics.mean(values))
    if not ratios:
        raise statistics.StatisticsError("mean requires at least one data point")
    den = max(d for _, d in ratios)
    return sum(n * (den // d) for n, d in ratios) / (den * len(ratios))


def single_threaded_blas() -> None:
    """Ask numpy's BLAS for one thread, unless the user chose a number. Called before numpy is imported:
    the analysis' products are small (2,000 × 200), and BLAS threads that wait for work cost ten times
    the CPU of the product itself on a busy host."""
    if "numpy" not in sys.modules:
        for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(name, "1")


DESCRIPTIVES = ("n", "mean", "median", "p05", "p50", "p90", "p95", "p99", "min", "max", "sum", "std")


def describe(values) -> dict:
    """``{n, mean, median, p05, p50, p90, p95, p99, min, max, sum, std}`` of the finite values.

    Percentiles are numpy's linear ones (p50 equals the median); std is the sample std (ddof 1).
    """
    import numpy as np

    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return {key: (0 if key == "n" else None) for key in DESCRIPTIVES}
    arr = np.asarray(finite, dtype=float)
    p05, p50, p90, p95, p99 = (float(q) for q in np.percentile(arr, [5, 50, 90, 95, 99]))
    return {
        "n": len(finite),
        "mean": exact_mean(finite),
        "median": float(np.median(arr)),
        "p05": p05, "p50": p50, "p90": p90, "p95": p95, "p99": p99,
        "min": float(arr.min()),
        "max": float(arr.max()),
        "sum": math.fsum(finite),
        "std": float(arr.std(ddof=1)) if len(finite) > 1 else 0.0,
    }


# --- Student t quantile (no scipy: the regularized incomplete beta by continued fraction) -------------

def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """Inverse CDF of Student's t by bisection (|error| < 1e-10)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError("t_quantile needs 0 < p < 1 and df > 0")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


# --- ordinary least squares --------------------------------------------------------------------------

@dataclass(frozen=True)
class OlsFit:
    response: str
    regressors: tuple[str, ...]
    coefficients: tuple[float, ...]
    std_errors: tuple[float, ...]
    ci95: tuple[tuple[float, float], ...]
    n: int
    df_resid: int
    r_squared: float
    residual_std: float

    def to_json(self) -> dict:
        return {
            "response": self.response,
            "n": self.n,
            "df_resid": self.df_resid,
            "r_squared": self.r_squared,
            "residual_std": self.residual_std,
            "coefficients": [
                {"name": name, "estimate": est, "std_error": se, "ci95_low": lo, "ci95_high": hi}
                for name, est, se, (lo, hi) in zip(self.regressors, self.coefficients, self.std_errors, self.ci95)
            ],
        }

    def coefficient(self, name: str) -> float:
        return self.coefficients[self.regressors.index(name)]


def ols(response: str, y, columns: dict) -> OlsFit | None:
    """Fit y = X·β by least squares; ``columns`` maps regressor name -> values (include the intercept).

    Rows with a missing value anywhere are dropped. Returns None when there are not more rows than
    regressors or the design is rank deficient. CIs are β ± t(0.975, n−p)·se with
    se = sqrt(diag(σ²(XᵀX)⁻¹)), σ² = RSS/(n−p).
    """
    import numpy as np

    names = tuple(columns)
    rows = [i for i in range(len(y)) if y[i] is not None and all(columns[c][i] is not None for c in names)]
    n, p = len(rows), len(names)
    if n <= p:
        return None
    X = np.array([[columns[c][i] for c in names] for i in rows], dtype=float)
    Y = np.array([y[i] for i in rows], dtype=float)
    if np.linalg.matrix_rank(X) < p:
        return None
    beta, _, _, _ = np.linalg.lstsq(X, Y, rcond=None)
    resid = Y - X @ beta
    df = n - p
    rss = float(resid @ resid)
    sigma2 = rss / df
    cov = sigma2 * np.linalg.inv(X.T @ X)
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    t = t_quantile(0.975, df)
    tss = float(((Y - Y.mean()) ** 2).sum())
    r2 = 1.0 - rss / tss if tss > 0 else 1.0
    return OlsFit(response, names, tuple(map(float, beta)), tuple(map(float, se)),
                  tuple((float(b - t * s), float(b + t * s)) for b, s in zip(beta, se)),
                  n, df, r2, math.sqrt(sigma2))


# --- bootstrap ----------------------------------------------------------------------------------------

SCHEMES = {
    "kit": "one index matrix per sample size and stream, drawn in blocks of 2000 rows from default_rng([seed, stream, n]); "
           "shared by every metric",
    "published": "the published analysis: default_rng(seed).integers(0, n, (draws, n)) drawn once per n and reused "
                 "for every paired difference; unpaired draws the other arm's matrix, then the reference's, "
                 "from one default_rng(seed)",
}


class Resampler:
    """Bootstrap resampling, shared by every metric of one comparison (a joint bootstrap).

    Index matrices of ``draws × n`` (drawn with replacement) are made once and reused for every
    metric, so all metrics see the same resampled steps; ``scheme`` says how they are drawn
    (SCHEMES). The CI is the 2.5/97.5 percentile of the resampled statistic; the % effect
    ``100·(mean(other)/mean(reference) − 1)`` is resampled with the same indices. Example::

        >>> r = Resampler(seed=1)
        >>> r.paired([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])["estimate"]
        0.5
    """

    def __init__(self, draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED, scheme: str = "kit"):
        if scheme not in SCHEMES:
            raise ValueError(f"bootstrap scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
        self.draws, self.seed, self.scheme = draws, seed, scheme
        self._indices: dict = {}

    def _matrix(self, n: int, stream: int):
        import numpy as np

        key = (n, stream)       # the published scheme's index matrices (the kit's: _resampled_means)
        if key not in self._indices:
            if stream == 0:
                self._indices[key] = np.random.default_rng(self.seed).integers(0, n, size=(self.draws, n))
            else:   # unpaired, published: the other arm's matrix first, then the reference's, from one generator
                n_other, n_ref = n
                rng = np.random.default_rng(self.seed)
                other = rng.integers(0, n_other, size=(self.draws, n_other))
                self._indices[key] = (other, rng.integers(0, n_ref, size=(self.draws, n_ref)))
        return self._indices[key]

    def _resampled_means(self, n: int, stream: int, columns):
        """``draws × k`` resampled means of the ``n × k`` values, for the kit's scheme.

        The draws come in blocks of CHUNK rows from ``default_rng([seed, stream, n])``: each block's index
        matrix becomes counts (how often each step is drawn), multiplied by every column at once. A block
        stays in the CPU cache; gathering draws × n values per metric does not.
        """
        import numpy as np

        rng = np.random.default_rng([self.seed, stream, n])
        out = np.empty((self.draws, columns.shape[1]))
        for start in range(0, self.draws, CHUNK):
            rows = min(CHUNK, self.draws - start)
            idx = rng.integers(0, n, size=(rows, n), dtype=np.intp)
            idx += np.arange(rows, dtype=np.intp)[:, None] * n
            counts = np.bincount(idx.ravel(), minlength=rows * n).reshape(rows, n).astype(float)
            np.matmul(counts, columns, out=out[start:start + rows])
        return out / n

    def _summary(self, estimate: float, means, method: str, n: tuple, percent=None) -> dict:
        import numpy as np

        lo, hi = np.percentile(means, [2.5, 97.5])
        out = {"estimate": estimate, "ci95_low": float(lo), "ci95_high": float(hi), "draws": self.draws,
               "seed": self.seed, "scheme": self.scheme, "method": method, "n": list(n), "percent": None}
        if percent is not None:
            est, draws = percent
            finite = draws[np.isfinite(draws)]
            if est is not None and len(finite) == len(draws):
                plo, phi = np.percentile(finite, [2.5, 97.5])
                out["percent"] = {"estimate": est, "ci95_low": float(plo), "ci95_high": float(phi)}
        return out

    def paired(self, reference, other) -> dict | None:
        """Mean of (other − reference) over aligned steps; pairs with a missing side are dropped."""
        return self.many([(reference, other, True)])[0]

    def unpaired(self, reference, other) -> dict | None:
        """mean(other) − mean(reference), each arm resampled independently."""
        return self.many([(reference, other, False)])[0]

    def many(self, jobs) -> list[dict | None]:
        """``paired``/``unpaired`` for each ``(reference, other, paired)`` of ``jobs``, in order.

        The kit's scheme resamples all of them at once: per sample size and stream, one product of the
        counts matrix (how often each step is drawn) with every metric's values. The resamples are the
        index matrix's; only the order in which the sums are rounded differs from gathering them.
        """
        import numpy as np

        prepared, columns = [], {}

        def column(key, values):
            columns.setdefault(key, []).append(values)
            return key, len(columns[key]) - 1

        for reference, other, paired in jobs:
            if paired:
                pairs = [(x, y) for x, y in zip(reference, other) if x is not None and y is not None]
                a = np.asarray([q[0] for q in pairs], dtype=float)
                b = np.asarray([q[1] for q in pairs], dtype=float)
                keys = ((len(a), 0), (len(b), 0))
            else:
                a = np.asarray([v for v in reference if v is not None], dtype=float)
                b = np.asarray([v for v in other if v is not None], dtype=float)
                keys = ((len(a), 1), (len(b), 2))
            if len(a) < 2 or len(b) < 2:
                prepared.append(None)
            elif self.scheme == "kit":
                prepared.append((paired, a, b, column(keys[0], a), column(keys[1], b)))
            else:
                prepared.append((paired, a, b, None, None))
        means = {key: self._resampled_means(*key, np.column_stack(cols)) for key, cols in columns.items()}
        out = []
        for job in prepared:
            if job is None:
                out.append(None)
                continue
            paired, a, b, ca, cb = job
            if ca is not None:
                ma, mb = means[ca[0]][:, ca[1]], means[cb[0]][:, cb[1]]
                resampled = mb - ma
            elif paired:   # the published arithmetic gathers the differences (bit for bit)
                m = self._matrix(len(a), 0)
                ma, mb, resampled = a[m].mean(axis=1), b[m].mean(axis=1), (b - a)[m].mean(axis=1)
            else:
                ib, ia = self._matrix((len(b), len(a)), 1)
                ma, mb = a[ia].mean(axis=1), b[ib].mean(axis=1)
                resampled = mb - ma
            estimate = exact_mean((b - a).tolist()) if paired else exact_mean(b.tolist()) - exact_mean(a.tolist())
            out.append(self._summary(estimate, resampled, "paired" if paired else "unpaired",
                                     (len(a),) if paired else (len(a), len(b)),
                                     _percent(a.tolist(), b.tolist(), ma, mb)))
        return out


def _percent(a, b, resampled_a, resampled_b):
    """The % effect 100·(mean(b)/mean(a) − 1) and its resampled values; None when mean(a) can be 0."""
    import numpy as np

    ref = exact_mean(a)
    if ref == 0 or not np.all(resampled_a != 0):
        return None
    return 100.0 * (exact_mean(b) / ref - 1.0), 100.0 * (resampled_b / resampled_a - 1.0)
