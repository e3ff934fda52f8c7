"""DP-ICL end to end on the tiny model (Wu et al. 2024): a draw's subsets vote through the flock engine, a plan's
queries are answered by RNM-Gaussian with a fixed seed, and a neighbouring dataset (one record more) changes at
most one subset's vote per query, so the released answers differ only as the mechanism allows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.data.taskspec import load_task_spec
from dpcore.dp_icl import aggregation, answer, ensemble, privacy, subsets
from dpcore.errors import ConfigError, DataValidationError

QUERIES = ["a fine film", "dull and long", "I laughed a lot", "never again"]


@pytest.fixture(scope="module")
def setup():
    spec = load_task_spec("sst2")
    labels = spec.label_names
    records = [(f"review {i} was {'great' if i % 2 else 'awful'}{'!' * (i % 3)}", labels[i % 2], f"r{i}")
               for i in range(30)]
    plan = privacy.dp_icl_plan(None, 1e-4, len(QUERIES), len(records), subsets=4, shots=2, noise_multiplier=1.0)
    return spec, labels, records, plan


def test_answers_are_labels_and_reproducible_with_a_fixed_seed(tiny_lm, setup):
    spec, labels, records, plan = setup
    key = subsets.run_key(np.random.default_rng(0))
    first = answer.answer_queries(tiny_lm, spec, records, QUERIES, plan, key, np.random.default_rng(1))
    assert len(first.labels) == len(QUERIES) and set(first.labels) <= set(labels)
    again = answer.answer_queries(tiny_lm, spec, list(reversed(records)), QUERIES, plan, key,
                                  np.random.default_rng(1))
    assert again == first
    # a later batch continues the run's queries; beyond the plan's queries nothing is answered
    tail = answer.answer_queries(tiny_lm, spec, records, QUERIES[2:], plan, key, np.random.default_rng(1),
                                 first_query=2)
    assert tail.first_query == 2 and set(tail.labels) <= set(labels)
    with pytest.raises(ConfigError, match="covers 4"):
        answer.answer_queries(tiny_lm, spec, records, QUERIES, plan, key, np.random.default_rng(1), first_query=1)


def test_each_query_is_voted_by_its_draws_subsets(tiny_lm, setup):
    """The ensemble's votes are the flock engine's on each draw's prompts, every subset voting once."""
    from dpcore.pate import flock

    spec, labels, records, plan = setup
    key = subsets.run_key(np.random.default_rng(2))
    rate = plan.parameters["sampling_rate"]
    votes = ensemble.ensemble_votes(tiny_lm, spec, records, QUERIES, key, subsets=4, shots=2, rate=rate)
    assert votes.shape == (4, len(QUERIES))
    assert (aggregation.vote_histograms(votes, len(labels)).sum(axis=1) == 4).all()
    by_id = ensemble.records_by_id(records)
    drawn = subsets.draw_subsets(list(by_id), key, 3, 4, 2, rate)
    prompts = [[by_id[r] for r in demos] for demos in drawn.demos]
    alone = flock.votes(tiny_lm, spec, flock.flock_scores(tiny_lm, spec, prompts, [QUERIES[3]], labels), labels,
                        "calibrated")
    assert votes[:, 3].tolist() == alone[:, 0].tolist()
    with pytest.raises(DataValidationError):
        ensemble.records_by_id(records + [("another text", labels[0], "r0")])


def test_a_neighbouring_dataset_moves_one_vote_per_query_at_most(tiny_lm, setup):
    """D plus one record, same key: per query only the new record's subset may vote differently, the histogram
    moves by at most sqrt(2); with the same noise the answers differ only where that moved vote decides."""
    spec, labels, records, plan = setup
    key = subsets.run_key(np.random.default_rng(3))
    rate = plan.parameters["sampling_rate"]
    base = ensemble.ensemble_votes(tiny_lm, spec, records, QUERIES, key, subsets=4, shots=2, rate=rate)
    # an added record that the first query's draw samples (its id chosen from public candidates by the key)
    threshold = subsets.inclusion_threshold(rate)
    added = next(f"added-{j}" for j in range(100) if subsets.record_draw(key, 0, f"added-{j}", 4)[1] < threshold)
    extra = ("an extra review, quite great", labels[1], added)
    more = ensemble.ensemble_votes(tiny_lm, spec, records + [extra], QUERIES, key, subsets=4, shots=2, rate=rate)
    ids = [r[2] for r in records]
    for i in range(len(QUERIES)):
        bucket, _ = subsets.record_draw(key, i, added, 4)
        before = subsets.draw_subsets(ids, key, i, 4, 2, rate)
        after = subsets.draw_subsets(ids + [added], key, i, 4, 2, rate)
        assert [j for j in range(4) if before.demos[j] != after.demos[j]] in ([], [bucket])
        changed = np.flatnonzero(base[:, i] != more[:, i]).tolist()
        assert changed in ([], [bucket])
    assert subsets.draw_subsets(ids, key, 0, 4, 2, rate) != subsets.draw_subsets(ids + [added], key, 0, 4, 2, rate)
    diff = aggregation.vote_histograms(more, len(labels)) - aggregation.vote_histograms(base, len(labels))
    assert np.linalg.norm(diff, axis=1).max() <= math.sqrt(2) + 1e-12
    std = plan.parameters["noise_std"]
    a = aggregation.rnm_gaussian(aggregation.vote_histograms(base, len(labels)), std, np.random.default_rng(4))
    b = aggregation.rnm_gaussian(aggregation.vote_histograms(more, len(labels)), std, np.random.default_rng(4))
    same = (diff == 0).all(axis=1)
    assert (a[same] == b[same]).all()


def test_black_box_votes_include_other(tiny_lm, setup):
    spec, labels, records, plan = setup
    key = subsets.run_key(np.random.default_rng(5))
    votes = ensemble.ensemble_votes(tiny_lm, spec, records, QUERIES[:2], key, subsets=4, shots=2,
                                    rate=plan.parameters["sampling_rate"], mode="black-box")
    assert votes.min() >= 0 and votes.max() <= len(labels)
    released = answer.answer_queries(tiny_lm, spec, records, QUERIES[:2], plan, key, np.random.default_rng(6),
                                     mode="black-box")
    assert set(released.labels) <= set(labels) | {None}
