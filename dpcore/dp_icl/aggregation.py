"""DP-ICL's private aggregation for classification: report-noisy-max with Gaussian noise (RNM-Gaussian, Wu et
al. 2024, Section 3.2) on each query's vote histogram.

For a query x the M subsets' votes give the histogram n(x) = (n_1, ..., n_C) (n_j: subsets voting j; every
subset votes, so sum_j n_j = M). The released answer is argmax_j (n_j + N(0, s^2)), s the noise std, drawn
independently per class and per query. Adding or removing one private record changes at most one subset
(`dpcore.dp_icl.subsets`), hence moves one vote from a class to another: ||n - n'||_2 <= sqrt(2)
(`VOTE_SENSITIVITY`). The argmax is post-processing of the Gaussian mechanism on n, so one query is a Gaussian
mechanism of noise multiplier sigma = s / sqrt(2) (`dpcore.privacy.events.gaussian_event(s, sqrt(2))`), the
step the accountant composes (`dpcore.dp_icl.privacy`).

No threshold and no zero-shot fallback: the paper's classification aggregation answers every query by RNM
(the propose-test-release check with a zero-shot fallback belongs to its keyword-space aggregation for
generation). In black-box vote mode a subset whose greedy token is no label votes "other" (class L), which RNM
may return like any class.

Noise comes from the `np.random.Generator` passed in (the caller's cryptographically seeded source).
"""

from __future__ import annotations

import math

import numpy as np

from dpcore.errors import ConfigError
from dpcore.pate.gnmax import vote_histograms

VOTE_SENSITIVITY = math.sqrt(2.0)  # one subset's vote moves: the histogram's L2 change under add/remove


def noise_std(noise_multiplier: float) -> float:
    """The per-class Gaussian noise std s = sigma x VOTE_SENSITIVITY for a query noise multiplier sigma."""
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    return sigma * VOTE_SENSITIVITY


def noisy_histograms(histograms: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """[Q, C] counts + independent N(0, std^2) per entry (PRIVATE: only their argmax is released)."""
    counts = np.asarray(histograms, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[1] < 1:
        raise ValueError("histograms: expected a [queries, classes] array")
    s = float(std)
    if not (math.isfinite(s) and s >= 0):
        raise ConfigError(f"noise std must be a finite number >= 0, got {std!r}")
    return counts + rng.normal(0.0, s, size=counts.shape) if s > 0 else counts.copy()


def rnm_gaussian(histograms: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """RNM-Gaussian on every query: [Q, C] vote counts -> [Q] released class indices (std 0: the plain
    plurality vote, not private; ties to the lowest index)."""
    return noisy_histograms(histograms, std, rng).argmax(axis=1).astype(np.int64)


__all__ = ["VOTE_SENSITIVITY", "noise_std", "noisy_histograms", "rnm_gaussian", "vote_histograms"]
