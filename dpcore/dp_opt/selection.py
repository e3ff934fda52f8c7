"""DP-OPT's private choices over counts: the next token of the instruction, and the candidate kept.

Token (Hong et al. 2024, Algorithm 1, the private token step): the M subsets' votes form a histogram over the
vocabulary; adding or removing one record changes one subset, so one vote moves (or appears or vanishes): the
histogram's L_inf sensitivity is 1 (L1 2). The token is the argmax of the histogram plus i.i.d. noise of scale
2 sigma on every vocabulary entry:

- Gumbel (the paper's noise; with it the noisy argmax is the exponential mechanism exp(count / (2 sigma)),
  McSherry and Talwar 2007, sensitivity 1): pure 1/sigma-DP;
- exponential (report-noisy-max, Ding et al. 2021 / permute-and-flip): pure 1/sigma-DP.

Either is charged as `ReportNoisyMaxDpEvent(sigma)`, whose accounting reads only its pure epsilon 1/sigma.

Deliberate differences from the authors' `LDGumbelMechanism`: (1) they draw Gumbel noise of scale 1/epsilon_0
and charge epsilon_0, which holds for monotone counts only; a moved vote is not monotone (one count -1, another
+1), so the scale here is 2/epsilon_0. (2) Their limited-domain variant (Durfee and Rogers 2019: only the top
k-bar = 10 counts and a noisy threshold, (epsilon_0, delta_0)-DP, failing with no token) is replaced by its
k-bar = |V| case (their `k_bar == dim` branch): every vocabulary entry gets noise, which is pure DP, never fails
and needs no delta_0.

Stopping rule: a candidate ends at an end-of-text token or a token whose text holds a newline (both read from the
released token: post-processing), or after T tokens.

Candidate (the authors' `ExpMechanism` over holdout accuracy): each candidate instruction's number of correctly
classified holdout records; one holdout record adds 0 or 1 to each count (L_inf sensitivity 1); Gumbel noise of
scale 2 sigma_sel and the argmax: pure 1/sigma_sel-DP (`ReportNoisyMaxDpEvent(sigma_sel)`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dpcore.errors import ConfigError

SENSITIVITY = 1.0  # L_inf: one record moves one subset's vote


def vote_histogram(votes: Sequence[int], vocab_size: int) -> np.ndarray:
    """Counts [V] of the subsets' votes (token ids in [0, V))."""
    votes = np.asarray(list(votes), dtype=np.int64)
    if votes.size and (votes.min() < 0 or votes.max() >= vocab_size):
        raise ConfigError(f"dp-opt: a vote outside the vocabulary [0, {vocab_size})")
    return np.bincount(votes, minlength=vocab_size).astype(np.float64)


def noise(size: int, noise_multiplier: float, rng: np.random.Generator, kind: str = "gumbel") -> np.ndarray:
    """`size` i.i.d. draws of scale 2 sigma: Gumbel(0, 2 sigma) or Exponential(mean 2 sigma)."""
    scale = 2.0 * float(noise_multiplier)
    if kind == "gumbel":
        return rng.gumbel(0.0, scale, size)
    if kind == "exponential":
        return rng.exponential(scale, size)
    raise ConfigError(f"dp-opt noise must be gumbel or exponential, got {kind!r}")


def noisy_argmax(counts: np.ndarray, noise_multiplier: float, rng: np.random.Generator,
                 kind: str = "gumbel") -> int:
    """argmax(counts + noise of scale 2 sigma): pure 1/sigma-DP for counts of L_inf sensitivity 1.
    sigma = 0 is the plain argmax (not private; lowest index on ties)."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0:
        raise ConfigError("dp-opt: a private choice needs a non-empty vector of counts")
    if noise_multiplier == 0:
        return int(np.argmax(counts))
    return int(np.argmax(counts + noise(counts.size, noise_multiplier, rng, kind)))


def private_token(votes: Sequence[int], vocab_size: int, noise_multiplier: float, rng: np.random.Generator,
                  kind: str = "gumbel") -> int:
    """The released token of one step: `noisy_argmax` of `vote_histogram(votes)`."""
    return noisy_argmax(vote_histogram(votes, vocab_size), noise_multiplier, rng, kind)


def stops(token: int, token_text: str, eos_ids: Iterable[int]) -> bool:
    """The stopping rule, on the released token alone: end-of-text, or a newline in its text."""
    return int(token) in set(eos_ids) or "\n" in token_text


def private_candidate(correct_counts: Sequence[float], noise_multiplier: float, rng: np.random.Generator) -> int:
    """The kept candidate: Gumbel noisy argmax of the holdout correct counts (the exponential mechanism)."""
    return noisy_argmax(np.asarray(correct_counts, dtype=np.float64), noise_multiplier, rng, "gumbel")
