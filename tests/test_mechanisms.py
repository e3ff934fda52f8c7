"""Algorithm 1 lines 7-19: RVP, Gaussian aggregation, report-noisy-max, the noise source, sensitivity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpcore.errors import ConfigError
from dpcore.fewshot.mechanisms import (
    aggregate,
    exponential_noise,
    gaussian_aggregate,
    gaussian_noise,
    noise_generator,
    noise_seed_sequence,
    noisy_argmax,
    normalise_by_max,
    pre_noise_sum,
    public_top_k,
    report_noisy_max_aggregate,
    restrict_to_vocab,
    restricted_softmax,
)
from dpcore.fewshot.sampling import poisson_groups


def _probs(rows, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, vocab, generator=gen) * 3, dim=-1)


# --------------------------------------------------------------------------- noise source


def test_seeded_generator_is_reproducible_and_flagged():
    (a, seeded_a), (b, seeded_b) = noise_generator(42), noise_generator(42)
    assert seeded_a and seeded_b
    assert np.array_equal(a.standard_normal(5), b.standard_normal(5))


def test_fresh_secure_seeding_differs_every_call():
    draws = []
    for _ in range(3):
        rng, seeded = noise_generator(None)
        assert seeded is False
        draws.append(tuple(gaussian_noise(4, 1.0, rng)))
    assert len(set(draws)) == 3
    roots = {noise_seed_sequence(None)[0].entropy for _ in range(3)}
    assert len(roots) == 3


@pytest.mark.parametrize("seed", [-1, 1.5, "x", True])
def test_bad_seed_is_refused(seed):
    with pytest.raises(ConfigError, match="seed"):
        noise_generator(seed)


# --------------------------------------------------------------------------- noise scales


def test_gaussian_noise_has_std_sqrt2_sigma():
    rng, _ = noise_generator(0)
    for sigma in (0.39, 1.7):
        noise = gaussian_noise(10_000, sigma, rng)
        assert noise.std() == pytest.approx(math.sqrt(2) * sigma, rel=0.05)
        assert abs(noise.mean()) < 5 * math.sqrt(2) * sigma / 100


def test_gaussian_aggregate_noise_through_the_mechanism():
    rng, _ = noise_generator(1)
    probs = _probs(4, 10_000)
    noisy = gaussian_aggregate(probs, 0.5, rng).numpy()
    noise = noisy - pre_noise_sum(probs)
    assert noise.std() == pytest.approx(math.sqrt(2) * 0.5, rel=0.05)


def test_sigma_zero_is_exactly_zero_noise_on_the_same_path():
    probs = _probs(5, 300)
    rng_a, _ = noise_generator(3)
    rng_b, _ = noise_generator(3)
    assert np.array_equal(gaussian_aggregate(probs, 0.0, rng_a).numpy(), pre_noise_sum(probs))
    assert np.array_equal(report_noisy_max_aggregate(probs, 0.0, rng_a).numpy(), normalise_by_max(probs).sum(0))
    # The same draws were consumed as with sigma > 0 (streams stay aligned).
    gaussian_aggregate(probs, 1.0, rng_b)
    report_noisy_max_aggregate(probs, 1.0, rng_b)
    assert rng_a.random() == rng_b.random()


def test_rnm_noise_is_exponential_with_mean_two_sigma():
    rng, _ = noise_generator(4)
    sigma = 0.8
    noise = exponential_noise(10_000, sigma, rng)
    assert noise.min() >= 0
    assert noise.mean() == pytest.approx(2 * sigma, rel=0.05)
    assert noise.std() == pytest.approx(2 * sigma, rel=0.05)  # exponential: std = mean
    noisy = report_noisy_max_aggregate(_probs(3, 10_000), sigma, rng).numpy()
    assert (noisy - normalise_by_max(_probs(3, 10_000)).sum(0)).mean() == pytest.approx(2 * sigma, rel=0.05)


@pytest.mark.parametrize("sigma", [-0.1, float("nan"), float("inf")])
def test_bad_noise_multiplier_is_refused(sigma):
    with pytest.raises(ConfigError, match="noise_multiplier"):
        gaussian_aggregate(_probs(2, 5), sigma, noise_generator(0)[0])


def test_unknown_mechanism_is_refused():
    with pytest.raises(ConfigError, match="mechanism"):
        aggregate("laplace", _probs(2, 5), 1.0, noise_generator(0)[0])


# --------------------------------------------------------------------------- RVP


def test_public_top_k_orders_by_public_probability():
    public = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    assert public_top_k(public, 3).tolist() == [1, 3, 4]
    assert public_top_k(torch.stack([public, public.flip(0)]), 2).shape == (2, 2)


@pytest.mark.parametrize("k", [0, 6, 2.5])
def test_top_k_outside_vocabulary_is_refused(k):
    with pytest.raises(ConfigError, match="top_k"):
        public_top_k(torch.ones(5), k)


def test_restrict_to_vocab_zeroes_the_rest_and_renormalises():
    probs = _probs(3, 50)
    keep = torch.tensor([4, 7, 9, 30])
    out = restrict_to_vocab(probs, keep)
    outside = torch.ones(50, dtype=torch.bool)
    outside[keep] = False
    assert torch.all(out[:, outside] == 0)
    assert torch.allclose(out.sum(1), torch.ones(3))
    assert torch.allclose(out[:, keep], probs[:, keep] / probs[:, keep].sum(1, keepdim=True))
    # A row with no mass on the kept set (underflow) becomes uniform on it.
    dead = torch.zeros(50)
    dead[0] = 1.0
    assert torch.allclose(restrict_to_vocab(dead, keep)[keep], torch.full((4,), 0.25))


def test_restricted_softmax_equals_restrict_then_renormalise():
    logits = torch.randn(4, 60) * 4
    keep = torch.tensor([3, 1, 59, 20, 8])
    expected = restrict_to_vocab(torch.softmax(logits.double(), -1), keep)[:, keep]
    assert torch.allclose(restricted_softmax(logits, keep), expected, atol=1e-12)
    assert torch.allclose(restricted_softmax(logits, None), torch.softmax(logits.double(), -1))
    # Stable where the plain softmax underflows on the kept set.
    extreme = torch.tensor([[0.0, -200.0, -210.0]])
    assert torch.allclose(restricted_softmax(extreme, torch.tensor([1, 2])).sum(), torch.tensor(1.0, dtype=torch.float64))


def test_rvp_choice_is_always_inside_public_top_k():
    rng, _ = noise_generator(5)
    for _ in range(100):
        public = torch.softmax(torch.randn(200), -1)
        keep = public_top_k(public, 10)
        groups = torch.softmax(torch.randn(6, 200) * 5, -1)  # private mass mostly outside S
        for mechanism in ("gaussian", "rnm"):
            scores = aggregate(mechanism, restricted_softmax(torch.log(groups), keep), 2.0, rng)
            assert noisy_argmax(scores, keep) in set(keep.tolist())


def test_noisy_argmax_ties_go_to_the_public_favourite():
    keep = torch.tensor([17, 3, 8])
    assert noisy_argmax(torch.zeros(3, dtype=torch.float64), keep) == 17
    assert noisy_argmax(torch.tensor([0.0, 2.0, 1.0]), None) == 1


def test_no_group_sums_to_zero():
    empty = torch.zeros((0, 7))
    assert np.array_equal(pre_noise_sum(empty), np.zeros(7))
    assert np.array_equal(report_noisy_max_aggregate(empty, 0.0, noise_generator(0)[0]).numpy(), np.zeros(7))


def test_rnm_divides_each_group_by_its_max():
    probs = _probs(5, 40)
    scores = normalise_by_max(probs)
    assert np.allclose(scores.max(axis=1), 1.0)
    assert np.all((scores >= 0) & (scores <= 1))


# --------------------------------------------------------------------------- sensitivity


def _group_distribution(members, record_vectors, keep):
    """A deterministic stand-in for LM(. | PB(records)): softmax of the summed record vectors."""
    logits = torch.as_tensor(record_vectors[np.sort(members)].sum(axis=0))
    return restricted_softmax(logits.unsqueeze(0), keep)[0]


@pytest.mark.parametrize("rvp", [True, False])
def test_neighbouring_datasets_move_the_sum_by_at_most_sqrt2(rvp):
    """Add one record (index n) to D with the same randomness: drop it from D' 's groups to get D's."""
    rng = np.random.default_rng(11)
    vocab, n, m = 30, 25, 5
    keep = torch.tensor([0, 3, 5, 7, 11, 13]) if rvp else None
    worst_l2 = worst_linf = 0.0
    changed = 0
    for _ in range(600):
        vectors = rng.normal(scale=4.0, size=(n + 1, vocab))
        groups_with = poisson_groups(n + 1, rng.uniform(0.1, 0.9), m, rng)
        groups_without = [g[g != n] for g in groups_with]
        dists = {}
        for name, groups in (("with", groups_with), ("without", groups_without)):
            rows = [_group_distribution(g, vectors, keep) for g in groups if len(g)]
            dists[name] = torch.stack(rows) if rows else torch.zeros((0, len(keep) if rvp else vocab))
        diff = pre_noise_sum(dists["with"]) - pre_noise_sum(dists["without"])
        worst_l2 = max(worst_l2, float(np.linalg.norm(diff)))
        rnm_diff = normalise_by_max(dists["with"]).sum(0) - normalise_by_max(dists["without"]).sum(0)
        worst_linf = max(worst_linf, float(np.abs(rnm_diff).max()))
        changed += bool(np.any(diff != 0))
    assert worst_l2 <= math.sqrt(2) + 1e-9
    assert worst_linf <= 1 + 1e-9
    assert worst_l2 > 1.0  # the bound is approached: the test would notice a looser sum
    assert changed > 150


# --------------------------------------------------------------------------- non-finite logits


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_group_contributes_exactly_the_uniform_vector(bad):
    """fp16 overflow: one group's logits hold NaN/inf. Its row is uniform over the kept set, the
    others are untouched, the sum and the noisy scores stay finite (the noise is not ignored)."""
    logits = torch.randn(4, 50) * 3
    keep = torch.tensor([7, 2, 30, 41, 9])
    clean = restricted_softmax(logits, keep)
    if bad == -math.inf:
        logits[1] = -math.inf  # no kept coordinate has any mass: softmax is 0/0
    else:
        logits[1, keep[2]] = bad
    probs = restricted_softmax(logits, keep)
    assert torch.equal(probs[1], torch.full((5,), 1 / 5, dtype=torch.float64))
    assert torch.equal(probs[[0, 2, 3]], clean[[0, 2, 3]])
    rng, _ = noise_generator(3)
    for mechanism in ("gaussian", "rnm"):
        scores = aggregate(mechanism, probs, 0.5, rng)
        assert torch.isfinite(scores).all()
    # RVP off: uniform over the whole vocabulary.
    full = restricted_softmax(logits, None)
    assert torch.equal(full[1], torch.full((50,), 1 / 50, dtype=torch.float64))


def test_aggregate_and_restrict_replace_non_finite_rows_by_uniform():
    probs = _probs(3, 6).double()
    probs[2, 4] = math.nan
    expected = probs.clone()
    expected[2] = 1 / 6
    assert np.array_equal(pre_noise_sum(probs), expected.sum(0).numpy())
    assert np.all(np.isfinite(normalise_by_max(probs)))
    assert np.array_equal(normalise_by_max(probs)[2], np.ones(6))
    keep = torch.tensor([4, 0, 1])
    vocab_probs = _probs(2, 6)
    vocab_probs[0, 0] = math.inf
    out = restrict_to_vocab(vocab_probs, keep)
    assert torch.equal(out[0, keep], torch.full((3,), 1 / 3))
    assert float(out[0].sum()) == pytest.approx(1.0)


def test_noise_decides_when_a_group_is_not_finite():
    """Before the guard the NaN row made every noisy score NaN and arg max returned index 0
    whatever the noise; now the released token varies with the noise."""
    keep = torch.arange(6)
    logits = torch.zeros(3, 6)
    logits[0, 0] = math.nan
    probs = restricted_softmax(logits, keep)
    rng, _ = noise_generator(9)
    chosen = {noisy_argmax(aggregate("gaussian", probs, 1.0, rng), keep) for _ in range(200)}
    assert len(chosen) == 6


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_sensitivity_bound_holds_when_the_changed_group_is_not_finite(bad):
    """One group changes (the neighbouring record) and its logits are non-finite on one side:
    the sum still moves by at most sqrt(2) in L2 and 1 in L_inf (report-noisy-max)."""
    gen = torch.Generator().manual_seed(4)
    keep = torch.tensor([0, 3, 5, 7])
    worst_l2 = worst_linf = 0.0
    for _ in range(300):
        logits = torch.randn(5, 12, generator=gen) * 6
        changed = logits.clone()
        changed[2] = torch.randn(12, generator=gen) * 6
        changed[2, keep[int(torch.randint(0, 4, (1,), generator=gen))]] = bad
        for with_keep in (keep, None):
            a, b = restricted_softmax(logits, with_keep), restricted_softmax(changed, with_keep)
            worst_l2 = max(worst_l2, float(np.linalg.norm(pre_noise_sum(a) - pre_noise_sum(b))))
            worst_linf = max(worst_linf, float(np.abs(normalise_by_max(a).sum(0) - normalise_by_max(b).sum(0)).max()))
    assert worst_l2 <= math.sqrt(2) + 1e-9
    assert worst_linf <= 1 + 1e-9
