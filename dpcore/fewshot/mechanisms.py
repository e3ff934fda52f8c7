"""Private aggregation of the M groups' next-token distributions (Tang et al., Algorithm 1).

- `noise_generator` / `noise_seed_sequence`: the noise source. Cryptographically seeded
  (`secrets`, 128 bits) unless the caller passes an explicit seed for an experiment; the
  returned flag says which, so a seeded run can be marked and refused at release.
- `public_top_k`, `restrict_to_vocab`, `restricted_softmax`: RVP, lines 7-10. The set S is
  the top-K of the PUBLIC prompt's distribution (instruction + label + text so far, no
  private record), so choosing S costs no privacy. Every group's distribution is zeroed
  outside S and renormalised over S.
- `gaussian_aggregate`: line 12. Sum of the group distributions plus N(0, 2 sigma^2) on each
  coordinate. The sum has L2 sensitivity sqrt(2) under add/remove of one record (one group
  changes, from one probability vector to another or from nothing to one), so this is a
  Gaussian mechanism with noise multiplier sigma. The paper's 1/M factor does not change the
  arg max (lines 17/19) and is left out.
- `report_noisy_max_aggregate`: lines 14-15. Each group distribution divided by its maximum
  (values in [0, 1], so the sum has L_inf sensitivity 1), summed, plus exponential noise.
  Convention of this project: `noise_multiplier` sigma means exponential noise of scale
  (mean) 2*sigma, i.e. per-step pure epsilon_0 = 1/sigma (Theorem A.4 with Delta = 1:
  Expo(epsilon_0 / 2)). The paper's own sigma for this mechanism is epsilon_0, i.e. 1/ours;
  with ours, sigma = 0 means no noise for both mechanisms.
- `noisy_argmax`: lines 16-19, the released token.

Non-finite logits (possible in fp16/bf16: an overflow gives inf, inf - inf gives NaN) would make
a group's softmax row NaN, the noisy sum NaN on every coordinate, and the arg max then picks
the first NaN, ignoring the noise. Every group row whose kept coordinates are not a finite
probability vector is therefore replaced by the uniform distribution over the kept set (the
RVP top-K set S, or the whole vocabulary with RVP off) before aggregation
(`uniform_if_not_finite`, applied in `restricted_softmax`, `restrict_to_vocab` and again in
`aggregate`). The replacement is still a probability vector, so each group's contribution
stays in the simplex and the sqrt(2) L2 (and L_inf 1 for report-noisy-max) sensitivity
argument is unchanged: it never looked at what the vector is, only that it is one.

With RVP on, noise is drawn only for the K kept coordinates: line 17 takes the arg max over
S, so noise on the other |V| - K coordinates never influences the output (same
distribution of the released token as the paper's full-vocabulary noise).

sigma = 0 runs the same code path: the standard draws are taken and multiplied by zero,
giving exactly zero noise (and keeping the random streams aligned with sigma > 0 runs).
"""

from __future__ import annotations

import math
import numbers
import secrets

import numpy as np
import torch

from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.names import check_mechanism

# --------------------------------------------------------------------------- noise source


def noise_seed_sequence(seed: int | None) -> tuple[np.random.SeedSequence, bool]:
    """Root of all randomness of one generation call, and whether it was seeded by the caller.

    `seed=None`: 128 bits from `secrets` (the operating system's CSPRNG): a fresh,
    unpredictable stream every call. An int: a reproducible experiment (seeded flag True).
    """
    if seed is None:
        return np.random.SeedSequence(secrets.randbits(128)), False
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer or None, got {seed!r}")
    return np.random.SeedSequence(int(seed)), True


def noise_generator(seed: int | None) -> tuple[np.random.Generator, bool]:
    """A numpy Generator for noise and sampling plus the seeded flag (see `noise_seed_sequence`)."""
    root, seeded = noise_seed_sequence(seed)
    return np.random.Generator(np.random.PCG64DXSM(root)), seeded


def check_noise_multiplier(noise_multiplier: float) -> float:
    value = float(noise_multiplier)
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise ConfigError(f"noise_multiplier (sigma) must be a finite number >= 0, got {noise_multiplier!r}")
    return value


# --------------------------------------------------------------------------- RVP (lines 7-10)


def public_top_k(public_probs: torch.Tensor, k: int) -> torch.Tensor:
    """Line 9: indices of the K most likely tokens of the public prompt, most likely first.

    `public_probs` is [V] or [B, V] (probabilities or logits: the order is the same);
    returns int64 [K] or [B, K]. ConfigError when K is not in [1, V].
    """
    vocab = public_probs.shape[-1]
    if int(k) != k or not 1 <= k <= vocab:
        raise ConfigError(f"{flag('top_k')} (K) must be an integer in [1, {vocab}] (the vocabulary size), got {k!r}")
    return torch.topk(public_probs, int(k), dim=-1, sorted=True).indices


def uniform_if_not_finite(probs: torch.Tensor) -> torch.Tensor:
    """Each row [..., C] that holds a NaN or an infinity becomes uniform over its C coordinates.

    Rows are probability vectors over the kept set (C = K with RVP, V without), so the
    replacement is the uniform distribution over that set: a probability vector, which keeps
    the sensitivity bound (see the module docstring). Finite rows are returned unchanged.
    """
    bad = ~torch.isfinite(probs).all(dim=-1, keepdim=True)
    if not bool(bad.any()):
        return probs
    return torch.where(bad, torch.full_like(probs, 1.0 / probs.shape[-1]), probs)


def restrict_to_vocab(group_probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Line 10: zero every coordinate outside `keep` and renormalise each row over `keep`.

    `group_probs` [G, V] (or [V]); returns the same shape. A row with no mass on `keep`
    (possible only through float underflow) or a non-finite value on `keep` becomes uniform
    on `keep`: still a probability vector, so the sensitivity argument is unchanged.
    """
    squeeze = group_probs.dim() == 1
    probs = group_probs.unsqueeze(0) if squeeze else group_probs
    kept = probs[:, keep]
    mass = kept.sum(dim=1, keepdim=True)
    uniform = torch.full_like(kept, 1.0 / kept.shape[1])
    kept = torch.where(mass > 0, kept / mass.clamp_min(torch.finfo(kept.dtype).tiny), uniform)
    kept = uniform_if_not_finite(kept)
    out = torch.zeros_like(probs)
    out[:, keep] = kept
    return out.squeeze(0) if squeeze else out


def restricted_softmax(group_logits: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Lines 6 and 10 in one stable step: softmax of the logits over `keep` only.

    Equal to `restrict_to_vocab(softmax(logits), keep)[..., keep]` (the renormalised kept
    coordinates, in `keep` order) without underflow. `keep=None` (RVP off): the full softmax.
    A group whose kept logits give no finite distribution (NaN, +inf, or all -inf) gets the
    uniform distribution over the kept set (`uniform_if_not_finite`).
    Returns float64 [G, K] (or [G, V]).
    """
    if keep is not None:  # restrict first: only K coordinates are converted and exponentiated
        group_logits = group_logits[..., keep]
    return uniform_if_not_finite(torch.softmax(group_logits.double(), dim=-1))


# --------------------------------------------------------------------------- aggregation


def _as_matrix(group_probs) -> np.ndarray:
    """float64 [G, C]; a row with a non-finite value becomes uniform over the C coordinates."""
    probs = group_probs.detach().cpu().double().numpy() if isinstance(group_probs, torch.Tensor) \
        else np.asarray(group_probs, dtype=np.float64)
    if probs.ndim != 2:
        raise ValueError(f"group_probs must be a 2-D [groups, vocabulary] array, got {probs.ndim} dimensions")
    bad = ~np.isfinite(probs).all(axis=1)
    if bad.any():
        probs = probs.copy()
        probs[bad] = 1.0 / probs.shape[1]
    return probs


def pre_noise_sum(group_probs) -> np.ndarray:
    """The quantity line 12 perturbs: sum over groups of their distributions (zeros for no group)."""
    return _as_matrix(group_probs).sum(axis=0)


def gaussian_noise(size: int, noise_multiplier: float, rng: np.random.Generator) -> np.ndarray:
    """N(0, 2 sigma^2) per coordinate (standard deviation sqrt(2) * sigma); exactly 0 at sigma = 0."""
    scale = math.sqrt(2.0) * check_noise_multiplier(noise_multiplier)
    return rng.standard_normal(size) * scale


def exponential_noise(size: int, noise_multiplier: float, rng: np.random.Generator) -> np.ndarray:
    """Expo with mean 2 sigma per coordinate (per-step epsilon_0 = 1/sigma); exactly 0 at sigma = 0."""
    scale = 2.0 * check_noise_multiplier(noise_multiplier)
    return rng.standard_exponential(size) * scale


def gaussian_aggregate(group_probs, noise_multiplier: float, rng: np.random.Generator) -> torch.Tensor:
    """Line 12: sum_i p_i + N(0, 2 sigma^2 I) over the given coordinates (float64 [V'])."""
    total = pre_noise_sum(group_probs)
    return torch.from_numpy(total + gaussian_noise(total.shape[0], noise_multiplier, rng))


def normalise_by_max(group_probs) -> np.ndarray:
    """Line 14: p_i / max_j p_i[j] for every group (rows with no mass stay zero)."""
    probs = _as_matrix(group_probs)
    peak = probs.max(axis=1, keepdims=True) if probs.shape[0] else np.ones((0, 1))
    return np.divide(probs, peak, out=np.zeros_like(probs), where=peak > 0)


def report_noisy_max_aggregate(group_probs, noise_multiplier: float, rng: np.random.Generator) -> torch.Tensor:
    """Lines 14-15: sum_i p_i / max(p_i) + Expo(mean 2 sigma) per coordinate (float64 [V'])."""
    scores = normalise_by_max(group_probs)
    total = scores.sum(axis=0) if scores.shape[0] else np.zeros(scores.shape[1])
    return torch.from_numpy(total + exponential_noise(total.shape[0], noise_multiplier, rng))


def aggregate(mechanism: str, group_probs, noise_multiplier: float, rng: np.random.Generator) -> torch.Tensor:
    if mechanism == "gaussian":
        return gaussian_aggregate(group_probs, noise_multiplier, rng)
    if mechanism == "rnm":
        return report_noisy_max_aggregate(group_probs, noise_multiplier, rng)
    check_mechanism(mechanism)
    raise AssertionError(f"mechanism {mechanism!r} is listed but has no aggregation")


def noisy_argmax(noisy_scores: torch.Tensor, keep: torch.Tensor | None) -> int:
    """Lines 16-19: the released token id. With RVP, `noisy_scores` is over `keep` (in its order).

    Ties go to the first coordinate; `keep` is ordered by public probability, so a tie
    (e.g. no group and sigma = 0) goes to the public favourite.
    """
    index = int(torch.argmax(noisy_scores).item())
    return int(keep[index].item()) if keep is not None else index
