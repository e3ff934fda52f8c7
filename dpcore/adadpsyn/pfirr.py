"""Precision-Focused Iterative Radius Reduction (PFIRR): AdaDPSyn's private aggregation of one token step
(Gao et al. 2024, PFIRR; implemented from the authors' code, `run_trec.py`, the token loop's body;
the paper's text was not at hand, so the steps and their order follow the code).

The M points are the M groups' next-token distributions over the K kept coordinates. Steps:

1. r = DP-GoodRadius(points, t = floor(coverage x M)) (`dpcore.adadpsyn.radius`): a private radius
   around which t points cluster.
2. R = sqrt(2)/2; c = normalise(max((sum of points + N(0, (2 R sigma_avg)^2 I)) / M, 0)), the first DP
   average (every point lies within sqrt(2)/2 of any centre of the simplex's pairs, so no clipping).
3. Up to T_update times: R' = r + lambda sqrt(K) (2 R sigma_avg) / M, the radius the next ball needs
   (the private radius plus lambda times the norm of the last average's noise). Stop if R < R'. DP test:
   stop if (#points within R' of c) + N(0, sigma_test^2) < mu_test x M. Otherwise R = R', clip every
   point into the ball of radius R around c, and c = the normalised DP average of the clipped points
   with noise N(0, (2 R sigma_avg)^2 I).
4. The scores are c; the token is its arg max (`dpcore.fewshot.mechanisms.noisy_argmax`).

Sensitivities (one point replaced; `dpcore.adadpsyn.accounting` charges them): L(r) 2, each count 1, each
sum of points clipped to a ball of radius R around c: 2R (both versions of the changed point lie in the
ball), R = sqrt(2)/2 for the first (points of the simplex). The centre c and every radius are functions of
earlier DP outputs and public parameters (post-processing), so each noise std is its sensitivity times a
fixed noise multiplier: the noise never falls below what the accounting assumes, whatever the data.

Points: with Poisson sampling a group may be empty; its point is the public distribution (its prompt, with
no record, is the public prompt; `pad_groups`), so there are always M points and adding or removing one
record replaces one point (one group's prompt changes). The M and K used are the configured ones (public).

Deliberate differences from the authors' code: every noise draw of the step is taken first (the stream's
position does not depend on the data; the authors reseed numpy's global generator with the same seed at
every token step, so their steps repeat one noise draw, and their sample too, which their subsampled
accountant does not model: here each step draws a fresh sample and fresh noise); the bisection's length
is public (`dpcore.adadpsyn.params.radius_search_iterations`); a normalised average with no positive
coordinate becomes the uniform vector (theirs divides by zero); rows that are not probability vectors
(NaN from fp16 logits) are made ones before aggregation, as in `dpcore.fewshot.mechanisms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpcore.adadpsyn.params import RADIUS_MAX, PfirrParams, coverage_count
from dpcore.adadpsyn.radius import L_SENSITIVITY, good_radius
from dpcore.errors import ConfigError
from dpcore.flags import flag

COUNT_SENSITIVITY = 1.0  # one point moves in or out of a ball


def average_sensitivity(radius: float) -> float:
    """L2 sensitivity of the sum of points clipped to a ball of radius R: 2R (one point replaced)."""
    return 2.0 * radius


@dataclass(frozen=True)
class Average:
    """One DP average: the ball's radius, the noise std used, the sum before noise and after. Private."""

    radius: float
    std: float
    total: np.ndarray
    noisy: np.ndarray


@dataclass(frozen=True)
class PfirrTrace:
    """Everything one PFIRR step computed. PRIVATE (pre-noise values depend on the records): for tests and
    the private store; only `scores` (a DP output) may leave."""

    num_groups: int
    cap: int
    radius: float                                        # DP-GoodRadius' r
    radius_queries: tuple[tuple[float, float, float], ...]  # (radius asked, L, noisy L)
    radius_std: float
    tests: tuple[tuple[float, int, float], ...]          # (radius tested, count, noisy count)
    test_std: float
    averages: tuple[Average, ...]
    scores: np.ndarray                                   # the final normalised DP average (arg max: the token)

    @property
    def final_radius(self) -> float:
        return self.averages[-1].radius


def _as_points(group_probs) -> np.ndarray:
    """float64 [G, K] probability vectors: a non-finite row becomes uniform, negative entries 0, each row
    renormalised (a row with no mass: uniform). Only probability vectors keep the sensitivities above."""
    if hasattr(group_probs, "detach"):
        group_probs = group_probs.detach().cpu().double().numpy()
    probs = np.array(group_probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] < 1:
        raise ValueError(f"group_probs must be a 2-D [groups, vocabulary] array, got shape {probs.shape}")
    bad = ~np.isfinite(probs).all(axis=1)
    probs[bad] = 1.0
    probs = np.maximum(probs, 0.0)
    mass = probs.sum(axis=1, keepdims=True)
    uniform = np.full_like(probs, 1.0 / probs.shape[1])
    return np.where(mass > 0, probs / np.where(mass > 0, mass, 1.0), uniform)


def pad_groups(group_probs, num_groups: int, public_probs=None) -> np.ndarray:
    """The step's M points: the non-empty groups' distributions [G, K] (G <= M) and, for each of the
    M - G empty groups, the public distribution `public_probs` [K] (uniform when None: RVP off), whose
    prompt holds no record. Which groups are empty is never looked at: only their number M - G, inside
    this call."""
    if hasattr(group_probs, "detach"):
        group_probs = group_probs.detach().cpu().double().numpy()
    width = np.shape(group_probs)[-1] if np.ndim(group_probs) == 2 else 0
    points = _as_points(group_probs) if np.size(group_probs) else None
    if public_probs is not None:
        if hasattr(public_probs, "detach"):
            public_probs = public_probs.detach().cpu().double().numpy()
        public = _as_points(np.asarray(public_probs, dtype=np.float64).reshape(1, -1))
    elif width:
        public = np.full((1, width), 1.0 / width)
    else:
        raise ConfigError("pad_groups: no group and no public distribution: the vocabulary size is unknown")
    groups = 0 if points is None else points.shape[0]
    if groups > num_groups:
        raise ConfigError(f"pad_groups: {groups} groups, more than {flag('num_subsets')} M = {num_groups}")
    if points is not None and points.shape[1] != public.shape[1]:
        raise ValueError("group_probs and public_probs must have the same number of coordinates")
    pads = np.repeat(public, num_groups - groups, axis=0)
    return pads if points is None else np.concatenate([points, pads], axis=0)


def count_within(points: np.ndarray, center: np.ndarray, radius: float) -> int:
    """#points within `radius` of `center` (the authors' `count_points_within_radius`)."""
    return int((np.linalg.norm(points - center, axis=1) <= radius).sum())


def clip_to_ball(points: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Every point moved onto the ball of `radius` around `center` when outside it (along its ray)."""
    offset = points - center
    norms = np.linalg.norm(offset, axis=1, keepdims=True)
    scale = np.where(norms > radius, radius / np.where(norms > 0, norms, 1.0), 1.0)
    return center + offset * scale


def normalised_center(noisy_sum: np.ndarray, num_groups: int) -> np.ndarray:
    """max(noisy sum / M, 0), renormalised to a probability vector (uniform when nothing is positive):
    the next ball's centre and the step's scores (post-processing of the DP average)."""
    mean = np.maximum(noisy_sum / num_groups, 0.0)
    mass = mean.sum()
    return mean / mass if mass > 0 else np.full_like(mean, 1.0 / mean.shape[0])


def pfirr(points, params: PfirrParams, rng: np.random.Generator) -> PfirrTrace:
    """PFIRR on the step's M points [M, K] (already padded: `pad_groups`), with its trace (module docstring).

    Draws, in this order and always all of them: 2 x radius iterations standard normals (DP-GoodRadius),
    (T_update + 1) x K (the averages), T_update (the tests); unused ones are discarded, so the stream's
    position never depends on the data."""
    points = _as_points(points)
    m, k = points.shape
    cap = coverage_count(params.coverage, m)
    radius, queries = good_radius(points, cap, params.tolerance, params.sigma_radius, rng)
    average_noise = rng.standard_normal((params.averages, k))
    test_noise = rng.standard_normal(params.tests)
    sqrt_k = math.sqrt(k)

    def average(clipped: np.ndarray, ball: float, j: int) -> Average:
        std = average_sensitivity(ball) * params.sigma_avg
        total = clipped.sum(axis=0)
        return Average(ball, std, total, total + std * average_noise[j])

    ball = RADIUS_MAX
    averages = [average(points, ball, 0)]
    center = normalised_center(averages[0].noisy, m)
    tests: list[tuple[float, int, float]] = []
    for j in range(params.updates):
        proposed = radius + params.shrink * sqrt_k * averages[-1].std / m
        if ball < proposed:  # no smaller ball to move to
            break
        count = count_within(points, center, proposed)
        noisy_count = count + params.sigma_test * COUNT_SENSITIVITY * test_noise[j]
        tests.append((proposed, count, float(noisy_count)))
        if noisy_count < params.test_fraction * m:  # too few points near the centre: keep R
            break
        ball = proposed
        averages.append(average(clip_to_ball(points, center, ball), ball, j + 1))
        center = normalised_center(averages[-1].noisy, m)
    return PfirrTrace(num_groups=m, cap=cap, radius=radius, radius_queries=tuple(queries),
                      radius_std=L_SENSITIVITY * params.sigma_radius, tests=tuple(tests),
                      test_std=COUNT_SENSITIVITY * params.sigma_test, averages=tuple(averages), scores=center)


def adaptive_aggregate(group_probs, params: PfirrParams, rng: np.random.Generator):
    """AdaDPSyn's aggregate of one token step: the M padded group distributions [M, K] -> noisy scores
    (float64 torch tensor [K]; arg max = the token). A drop-in for `dpcore.fewshot.mechanisms.aggregate`
    (which takes only the non-empty groups: pad them first with `pad_groups`)."""
    import torch  # the engine's tensors; the computation itself is numpy

    return torch.from_numpy(pfirr(group_probs, params, rng).scores)


__all__ = ["COUNT_SENSITIVITY", "Average", "PfirrTrace", "adaptive_aggregate", "average_sensitivity",
           "clip_to_ball", "count_within", "normalised_center", "pad_groups", "pfirr"]
