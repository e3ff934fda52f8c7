"""DP-GoodRadius: a private radius within which about t of the M points cluster (AdaDPSyn's radius search;
Nissim, Stemmer and Vadhan 2016, "Locating a small cluster privately", GoodRadius; the authors'
`dp_good_radius`, `L`, `B_r`).

For a radius r and a cap t:

  B_r(p)  = min(#{points within distance r of p, p itself included}, t)
  L(r)    = (1/t) x (sum of the t largest B_r(p) over the M points),   0 <= L(r) <= t

L(r) = t means t points each have at least t points within r. DP-GoodRadius bisects [0, sqrt(2)/2]: at the
midpoint m it asks L(m/2) and L(m) with Gaussian noise; if the noisy L(m/2) >= t, or else the noisy
L(m) >= t, the upper end moves to m, otherwise the lower end does; the radius is the final bracket's
midpoint.

Sensitivity (`L_SENSITIVITY` = 2): the neighbouring relation of the points is one point replaced (one
group's distribution changes; an empty group is the public distribution, see `dpcore.adadpsyn.pfirr`).
Every other point's capped count moves by at most 1, which moves the sum of the t largest by at most t;
the replaced point's own capped count lies in [0, t], which moves that sum by at most t more: 2t, i.e. 2
after the 1/t. Each query is a Gaussian mechanism with std 2 sigma_radius: noise multiplier sigma_radius
(the authors' `np.random.normal(0, 2*sigma_radius)` and `RDP_gaussian(sigma_radius)` per query).

Deliberate difference: the number of iterations is computed from the public bracket width
(`dpcore.adadpsyn.params.radius_search_iterations`), not by comparing the float bracket, so the number of
queries never depends on the data.
"""

from __future__ import annotations

import numpy as np

from dpcore.adadpsyn.params import RADIUS_MAX, radius_search_iterations

L_SENSITIVITY = 2.0  # |L(r; S) - L(r; S')| <= 2 when S' is S with one point replaced


def pairwise_distances(points: np.ndarray) -> np.ndarray:
    """[M, M] Euclidean distances between the rows of `points` [M, K]."""
    diff = points[:, None, :] - points[None, :, :]
    return np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))


def capped_counts(distances: np.ndarray, radius: float, cap: int) -> np.ndarray:
    """B_r(p) for every point: the points within `radius` (itself included), at most `cap`."""
    return np.minimum((distances <= radius).sum(axis=1), cap)


def good_radius_score(distances: np.ndarray, radius: float, cap: int) -> float:
    """L(r): the mean of the `cap` largest capped counts (a sum over fewer points when M < cap)."""
    counts = np.sort(capped_counts(distances, radius, cap))[::-1][:cap]
    return float(counts.sum()) / cap


def good_radius(points: np.ndarray, cap: int, tolerance: float, sigma_radius: float,
                rng: np.random.Generator) -> tuple[float, list[tuple[float, float, float]]]:
    """DP-GoodRadius on `points` [M, K]: (the radius, every query as (radius asked, L, noisy L)).

    Draws exactly 2 x `radius_search_iterations(tolerance)` standard normals from `rng` (all of them first,
    so the stream's position never depends on the data), scaled by L_SENSITIVITY x sigma_radius
    (sigma_radius = 0: no noise). The query list depends on the private points: private."""
    iterations = radius_search_iterations(tolerance)
    noise = rng.standard_normal(2 * iterations) * (L_SENSITIVITY * sigma_radius)
    distances = pairwise_distances(points)
    low, high = 0.0, RADIUS_MAX
    queries: list[tuple[float, float, float]] = []
    for i in range(iterations):
        mid = (low + high) / 2.0
        half = good_radius_score(distances, mid / 2.0, cap)
        full = good_radius_score(distances, mid, cap)
        noisy_half, noisy_full = half + noise[2 * i], full + noise[2 * i + 1]
        queries += [(mid / 2.0, half, noisy_half), (mid, full, noisy_full)]
        # both queries are always asked (and charged); the authors' order: L(m/2) first, then L(m)
        if noisy_half >= cap or noisy_full >= cap:
            high = mid
        else:
            low = mid
    return (low + high) / 2.0, queries


__all__ = ["L_SENSITIVITY", "capped_counts", "good_radius", "good_radius_score", "pairwise_distances"]
