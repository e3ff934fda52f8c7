"""PFIRR's public parameters (Gao et al. 2024, AdaDPSyn Algorithm 1 and the authors' code, `run_*.py`).

One token step aggregates M points, the M groups' next-token distributions over the K kept coordinates
(probability vectors). Its parameters, all public and fixed before any private record is read:

- `sigma_avg` (sigma_avg): noise multiplier of every DP average (noise std 2 R sigma_avg on the sum of
  points clipped to a ball of radius R). The one parameter a plan calibrates to the target epsilon, as the
  paper does (its tables vary sigma_avg only).
- `sigma_radius` (sigma_radius, paper 15): noise multiplier of DP-GoodRadius' queries (std 2 sigma_radius on
  L(r), whose sensitivity is 2).
- `sigma_test` (sigma_test, paper 5): noise multiplier of each DP coverage test (std sigma_test on a count,
  sensitivity 1).
- `tolerance` (paper 0.1): DP-GoodRadius' bisection of [0, sqrt(2)/2] stops at this bracket width.
- `coverage` (t, paper 0.8): the radius sought covers t = floor(coverage x M) points.
- `shrink` (lambda, paper 0.25): the new radius is r + lambda sqrt(K) x (noise std of the last average) / M.
- `test_fraction` (mu_test, paper 0.55): a radius update needs mu_test x M points (noisily) inside it.
- `updates` (T_update, paper 2): at most this many radius updates, each one test and one average.

The paper's values are the defaults (`PAPER`); none is ever tuned on private data.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from dpcore.errors import ConfigError
from dpcore.flags import flag

# The largest distance of a probability vector from the simplex's centre region that matters: two
# probability vectors are at most sqrt(2) apart, so every point lies in a ball of radius sqrt(2)/2 around
# their midpoint; DP-GoodRadius searches [0, RADIUS_MAX] and the first average uses R = RADIUS_MAX (sum
# sensitivity 2 R = sqrt(2), no clipping needed).
RADIUS_MAX = math.sqrt(2.0) / 2.0


@dataclass(frozen=True)
class PfirrParams:
    """PFIRR's parameters (module docstring); `sigma_avg` is the calibrated one. 0 for a sigma: no noise
    there (not private)."""

    sigma_avg: float
    sigma_radius: float = 15.0
    sigma_test: float = 5.0
    tolerance: float = 0.1
    coverage: float = 0.8
    shrink: float = 0.25
    test_fraction: float = 0.55
    updates: int = 2

    def __post_init__(self) -> None:
        for name in ("sigma_avg", "sigma_radius", "sigma_test"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigError(f"adadpsyn {name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not (isinstance(self.tolerance, numbers.Real) and 0.0 < self.tolerance < RADIUS_MAX):
            raise ConfigError(f"adadpsyn tolerance must be in (0, {RADIUS_MAX:.4f}), got {self.tolerance!r}")
        if not (isinstance(self.coverage, numbers.Real) and 0.0 < self.coverage <= 1.0):
            raise ConfigError(f"adadpsyn coverage must be in (0, 1], got {self.coverage!r}")
        if not (isinstance(self.shrink, numbers.Real) and math.isfinite(self.shrink) and self.shrink >= 0):
            raise ConfigError(f"adadpsyn shrink (lambda) must be a finite number >= 0, got {self.shrink!r}")
        if not (isinstance(self.test_fraction, numbers.Real) and 0.0 <= self.test_fraction <= 1.0):
            raise ConfigError(f"adadpsyn test_fraction (mu_test) must be in [0, 1], got {self.test_fraction!r}")
        if isinstance(self.updates, bool) or not isinstance(self.updates, numbers.Integral) or self.updates < 0:
            raise ConfigError(f"adadpsyn updates (T_update) must be an integer >= 0, got {self.updates!r}")
        for name in ("tolerance", "coverage", "shrink", "test_fraction"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "updates", int(self.updates))

    def with_sigma_avg(self, sigma_avg: float) -> PfirrParams:
        return replace(self, sigma_avg=sigma_avg)

    @property
    def radius_queries(self) -> int:
        """DP-GoodRadius' noisy queries per step: two per bisection iteration."""
        return 2 * radius_search_iterations(self.tolerance)

    @property
    def tests(self) -> int:
        """Coverage tests per step at most (one per radius update)."""
        return self.updates

    @property
    def averages(self) -> int:
        """DP averages per step at most: the first, then one per radius update."""
        return self.updates + 1


# The paper's hyperparameters (authors' `run_trec.py` defaults; sigma_avg is calibrated per epsilon).
PAPER = PfirrParams(sigma_avg=1.09)


def radius_search_iterations(tolerance: float) -> int:
    """DP-GoodRadius' bisection iterations: the fewest n with RADIUS_MAX / 2^n <= tolerance (the authors'
    `while r_high - r_low > tolerance` on [0, sqrt(2)/2]; their accountant's ceil(log2(sqrt(2)/2 / tol))).

    Counted on the public width alone, so the number of noisy queries never depends on the data (the
    authors' loop compares the float bracket, whose last bit depends on the branch taken)."""
    if not 0.0 < tolerance < RADIUS_MAX:
        raise ConfigError(f"adadpsyn tolerance must be in (0, {RADIUS_MAX:.4f}), got {tolerance!r}")
    n, width = 0, RADIUS_MAX
    while width > tolerance:
        n, width = n + 1, width / 2.0
    return n


def coverage_count(coverage: float, num_groups: int) -> int:
    """t = floor(coverage x M) (the authors' `int(t * M)`), at least 1: the points the radius should cover.
    M is the configured number of groups (public), never the number of non-empty ones."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral) or num_groups < 1:
        raise ConfigError(f"{flag('num_subsets')}: M must be an integer >= 1, got {num_groups!r}")
    return max(1, int(coverage * num_groups))


__all__ = ["PAPER", "RADIUS_MAX", "PfirrParams", "coverage_count", "radius_search_iterations"]
