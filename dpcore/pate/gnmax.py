"""Confident-GNMax aggregation of teacher votes (Papernot et al. 2018, Algorithm 1; Duan et al. App. C.2 Alg. 2).

For a public query x with vote histogram n(x) over the classes (n_j = teachers voting j):

    if max_j n_j(x) + N(0, sigma1^2) >= T:   answer argmax_j (n_j(x) + N(0, sigma2^2))
    else:                                    answer bottom (no label)

Sensitivity: one private record is in one teacher (`dpcore.pate.teachers`), so a neighbouring
dataset changes one teacher's vote: max_j n_j moves by at most 1 (the threshold test is a
Gaussian mechanism of L2 sensitivity 1 at noise sigma1) and the histogram by at most sqrt(2) in
L2 (GNMax: a Gaussian mechanism on the histogram; report-noisy-max of it). The accounting of these
two mechanisms is `dpcore.pate.privacy` (data-independent) and `dpcore.pate.data_dependent`.

Defaults (Duan et al. Table 7, GPT3, E = 200 teachers): T = 180, sigma1 = 1 (5 for AG News),
sigma2 = 20. T scales with the flock: `default_threshold(E)` = round(0.9 E), the same 90 % of
teachers agreeing (Table 7's 170-180 of 200 for GPT3; 320-390 of 400 for Claude). The sigmas are
absolute noise on vote counts, and a vote count's sensitivity does not depend on E, so their
privacy cost per query does not change with E; their effect on utility does (sigma2 = 20 against
a 20-teacher flock is noise on the scale of the whole vote), so small flocks want smaller sigma2.

Noise comes from the `np.random.Generator` passed in (the project's cryptographically seeded
source, `dpcore.fewshot.mechanisms.noise_generator`; a seeded run is marked unreleasable by the caller).
"""

from __future__ import annotations

import math

import numpy as np

from dpcore.errors import ConfigError
from dpcore.flags import flag

ABSTAIN = -1  # the answer bottom: the query gets no label
THRESHOLD_FRACTION = 0.9  # Table 7: T = 180 of E = 200


def default_threshold(teachers: int) -> float:
    """T for a flock of E teachers: round(0.9 E) (Table 7: 180 at E = 200)."""
    return float(round(THRESHOLD_FRACTION * teachers))


def check_gnmax_parameters(threshold: float, sigma1: float, sigma2: float, teachers: int) -> None:
    """T in [0, E] (a threshold above E is never met, up to noise: every query would be refused) and
    sigma1, sigma2 > 0 (zero noise is no privacy)."""
    for name, value in (("pate_sigma1", sigma1), ("pate_sigma2", sigma2)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag(name)}: the noise standard deviation must be a finite number > 0, got {value!r}")
    if not (math.isfinite(threshold) and 0 <= threshold <= teachers):
        raise ConfigError(f"{flag('pate_threshold')}: T = {threshold:g} must lie in [0, E] = [0, {teachers}] (the largest "
                          f"possible vote count is E); default: round(0.9 E) = {default_threshold(teachers):g}")


def vote_classes(labels, mode: str) -> int:
    """Histogram width: the labels, plus "other" in black-box mode."""
    return len(labels) + (1 if mode == "black-box" else 0)


def vote_histograms(votes: np.ndarray, classes: int) -> np.ndarray:
    """[E, Q] teacher votes (class index, or `ABSTAIN` for no vote) -> [Q, classes] vote counts (PRIVATE)."""
    votes = np.asarray(votes, dtype=np.int64)
    if votes.ndim != 2:
        raise ValueError("votes: expected a [teachers, queries] array")
    counts = np.zeros((votes.shape[1], classes), dtype=np.int64)
    for row in votes:
        valid = row >= 0
        np.add.at(counts, (np.flatnonzero(valid), row[valid]), 1)
    return counts


def confident_gnmax(histograms: np.ndarray, threshold: float, sigma1: float, sigma2: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2 of Duan et al. App. C.2 on every query: [Q, C] vote counts -> [Q] answers (class or ABSTAIN).

    Noise for the threshold test is drawn for every query; GNMax noise only for the answered ones
    (the released output is the same as drawing it for all).
    """
    counts = np.asarray(histograms, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError("histograms: expected a [queries, classes] array")
    for name, value in (("sigma1", sigma1), ("sigma2", sigma2)):
        if not value > 0:
            raise ConfigError(f"{name}: must be > 0, got {value!r}")
    answers = np.full(counts.shape[0], ABSTAIN, dtype=np.int64)
    passed = counts.max(axis=1) + rng.normal(0.0, sigma1, size=counts.shape[0]) >= threshold
    if passed.any():
        noisy = counts[passed] + rng.normal(0.0, sigma2, size=(int(passed.sum()), counts.shape[1]))
        answers[passed] = noisy.argmax(axis=1)
    return answers
