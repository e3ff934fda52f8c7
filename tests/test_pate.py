"""PromptPATE's building blocks (Duan et al. Section 4.2, App. C.2): what a DP reviewer asks of them.

Teachers are disjoint; removing one private record changes one teacher's prompt and so each vote
histogram by at most one vote (end to end: assignment -> prompts -> model -> votes); the threshold
test and GNMax draw Gaussian noise at the stated scales; the flock engine scores exactly what one
prompt at a time scores; public queries never overlap the private split; bad parameters are errors.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from dpcore.data.datasets import load_dataset, normalise_text
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import ConfigError, DataValidationError
from dpcore.pate import flock, gnmax, public_queries
from dpcore.pate.student import select_student, student_candidates
from dpcore.pate.teachers import Teachers, assign_teachers, check_flock_size

# ---------------------------------------------------------------- teachers


def _ids(n: int) -> list[str]:
    return [f"rec-{i}" for i in range(n)]


def test_teachers_are_disjoint_k_shot_and_independent_of_record_order():
    ids = _ids(2000)
    flock_a = assign_teachers(ids, 200, 3, np.random.default_rng(7))
    used = [rid for demos in flock_a.demos for rid in demos]
    assert len(used) == len(set(used))  # no record in two teachers
    assert set(used) <= set(ids)
    assert flock_a.count == 200 and max(len(d) for d in flock_a.demos) == 3
    assert sum(len(d) == 3 for d in flock_a.demos) > 190  # 10 records per bucket on average: nearly all full
    flock_b = assign_teachers(list(reversed(ids)), 200, 3, np.random.default_rng(7))
    assert flock_a == flock_b
    assert assign_teachers(ids, 200, 3, np.random.default_rng(8)) != flock_a  # the key comes from the generator
    assert Teachers.from_table(flock_a.table(), 200) == flock_a


def test_removing_a_record_changes_only_its_own_teacher():
    ids = _ids(600)
    full = assign_teachers(ids, 50, 2, np.random.default_rng(3))
    for removed in ["rec-0", "rec-17", "rec-599", full.demos[10][0]]:
        smaller = assign_teachers([i for i in ids if i != removed], 50, 2, np.random.default_rng(3))
        changed = [t for t in range(50) if full.demos[t] != smaller.demos[t]]
        assert len(changed) <= 1
        if any(removed in d for d in full.demos):
            assert changed and removed in full.demos[changed[0]]


@pytest.mark.parametrize("teachers, shots, records", [(201, 1, 200), (100, 3, 299), (0, 1, 5), (5, 0, 5)])
def test_flock_too_large_for_the_records_is_an_error(teachers, shots, records):
    with pytest.raises(ConfigError, match="pate_"):
        check_flock_size(teachers, shots, records)
    if teachers and shots:
        with pytest.raises(ConfigError, match="private split has only"):
            assign_teachers(_ids(records), teachers, shots, np.random.default_rng(0))


def test_histogram_sensitivity_end_to_end(tiny_lm):
    """Remove one record: assignment -> prompts -> flock votes; every query's histogram moves by one vote at most."""
    spec = load_task_spec("sst2")
    labels = spec.label_names
    texts = {f"r{i}": (f"review number {i} was {'great' if i % 2 else 'awful'} {'!' * (i % 3)}", labels[i % 2])
             for i in range(24)}
    queries = ["a fine film", "dull and long", "I laughed", "never again"]

    def histograms(ids):
        teachers = assign_teachers(ids, 8, 2, np.random.default_rng(11))
        prompts = [[texts[r] for r in demos] for demos in teachers.demos]
        scores = flock.flock_scores(tiny_lm, spec, prompts, queries, labels)
        return gnmax.vote_histograms(flock.votes(tiny_lm, spec, scores, labels, "calibrated"), len(labels))

    ids = sorted(texts)
    base = histograms(ids)
    assert base.sum(axis=1).tolist() == [8] * len(queries)
    for removed in ["r0", "r5", "r13", "r23"]:
        other = histograms([i for i in ids if i != removed])
        assert np.abs(base - other).sum(axis=1).max() <= 2          # one vote moved: L1 <= 2, L2 <= sqrt(2)
        assert np.abs(base.max(axis=1) - other.max(axis=1)).max() <= 1  # the threshold test's input: <= 1


# ---------------------------------------------------------------- Confident-GNMax


def test_threshold_test_noise_is_gaussian_at_sigma1():
    rng = np.random.default_rng(1)
    n, sigma1, top, threshold = 40000, 3.0, 50, 52
    hist = np.tile([top, 10], (n, 1))
    answered = gnmax.confident_gnmax(hist, threshold, sigma1, 1e-9, rng) != gnmax.ABSTAIN
    expected = norm.sf((threshold - top) / sigma1)  # P[top + N(0, sigma1^2) >= T]
    assert abs(answered.mean() - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


def test_gnmax_noise_is_gaussian_at_sigma2():
    rng = np.random.default_rng(2)
    n, sigma2, gap = 40000, 5.0, 8
    hist = np.tile([gap, 0], (n, 1))
    answers = gnmax.confident_gnmax(hist, 0, 1e-9, sigma2, rng)  # threshold 0: every query answered
    assert (answers != gnmax.ABSTAIN).all()
    flipped = (answers == 1).mean()
    expected = norm.sf(gap / (math.sqrt(2) * sigma2))  # P[N(0, 2 sigma2^2) > gap]
    assert abs(flipped - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


def test_gnmax_is_deterministic_in_the_generator_and_abstains_below_threshold():
    hist = np.array([[9, 1], [5, 5], [0, 10]])
    a = gnmax.confident_gnmax(hist, 8, 0.5, 1.0, np.random.default_rng(5))
    b = gnmax.confident_gnmax(hist, 8, 0.5, 1.0, np.random.default_rng(5))
    assert a.tolist() == b.tolist()
    assert a[1] == gnmax.ABSTAIN and a[0] == 0 and a[2] == 1


@pytest.mark.parametrize("threshold, sigma1, sigma2, match", [
    (201, 1, 20, "pate_threshold"), (-1, 1, 20, "pate_threshold"), (180, 0, 20, "pate_sigma1"),
    (180, 1, -2, "pate_sigma2"), (180, 1, math.nan, "pate_sigma2")])
def test_bad_gnmax_parameters(threshold, sigma1, sigma2, match):
    with pytest.raises(ConfigError, match=match):
        gnmax.check_gnmax_parameters(threshold, sigma1, sigma2, 200)


def test_default_threshold_scales_with_the_flock():
    assert gnmax.default_threshold(200) == 180  # Table 7
    assert gnmax.default_threshold(20) == 18 and gnmax.default_threshold(400) == 360


def test_vote_histograms_count_votes_and_other():
    votes = np.array([[0, 2, 1], [0, 1, 1], [2, 2, -1]])
    assert gnmax.vote_histograms(votes, 3).tolist() == [[2, 0, 1], [0, 1, 2], [0, 2, 0]]


# ---------------------------------------------------------------- the flock engine


def test_flock_scores_equal_one_prompt_at_a_time(tiny_lm):
    spec = load_task_spec("trec")  # several multi-token verbalizers
    labels = spec.label_names
    prompts = [[("what is the capital of france", labels[0])],
               [("who wrote hamlet", labels[3]), ("how many legs does a spider have", labels[5])], []]
    queries = ["where is paris", "how far is the moon from earth", "x"]
    fast = flock.flock_scores(tiny_lm, spec, prompts, queries, labels, max_rows=4)
    naive = flock.flock_scores_naive(tiny_lm, spec, prompts, queries, labels)
    np.testing.assert_allclose(np.concatenate([fast.logprobs, fast.content_free], axis=1), naive, atol=1e-4)


def test_black_box_votes_map_greedy_tokens_and_other(tiny_lm):
    spec = load_task_spec("sst2")
    labels = spec.label_names
    first = flock.verbalizer_first_tokens(tiny_lm, spec, labels)
    greedy = np.array([[first[1], first[0], 5]])
    scores = flock.FlockScores(np.zeros((1, 3, 2)), np.zeros((1, 0, 2)), greedy)
    assert flock.votes(tiny_lm, spec, scores, labels, "black-box").tolist() == [[1, 0, 2]]  # 2 = "other"
    assert gnmax.vote_classes(labels, "black-box") == 3


def test_ensemble_and_single_prompt_accuracy():
    votes = np.array([[0, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]])
    gold = np.array([0, 1, 1, 1])
    assert flock.ensemble_accuracy(votes, gold, 2) == 0.75
    assert flock.single_prompt_accuracies(votes, gold).tolist() == [0.75, 0.5, 0.75]


# ---------------------------------------------------------------- student


def test_student_is_chosen_on_the_other_answered_queries_only():
    noisy = np.array([0, 1, 1, 0])
    candidates = [[0], [1], [2]]
    predictions = np.array([[1, 1, 1, 0],   # wrong on its own query 0 (ignored): 3/3 on the others
                            [0, 0, 1, 0],   # 2/3
                            [0, 1, 0, 1]])  # 2/3
    choice = select_student(predictions, noisy, candidates)
    assert choice.candidate == 0 and choice.validation_accuracy == 1.0 and choice.members == (0,)
    groups = student_candidates(10, 3, 50, np.random.default_rng(0))
    assert len(groups) == 3 and all(len(g) == 3 for g in groups)
    assert len({i for g in groups for i in g}) == 9
    assert student_candidates(3, 3, 5, np.random.default_rng(0)) == []
    with pytest.raises(ConfigError, match="no candidate"):
        select_student(np.zeros((0, 2)), np.zeros(2), [])


# ---------------------------------------------------------------- public queries


def test_iid_public_split_is_outside_the_private_and_test_splits():
    data = load_dataset(load_task_spec("trec"))
    assert 400 < len(data.public) <= 500
    assert not set(data.public["id"]) & (set(data.train["id"]) | set(data.test["id"]))
    texts, where = public_queries.public_texts(data, "iid")
    # the shipped source's public split drops its own duplicates of private or test texts (two public files)
    private = {normalise_text(t) for t in list(data.train["text"]) + list(data.test["text"])}
    assert not any(normalise_text(t) in private for t in texts)
    queries = public_queries.select_queries(texts, 50, where)
    assert len(queries) == 50 and list(queries.columns) == public_queries.QUERY_COLUMNS


def test_ood_public_texts_drop_the_tasks_own_sentences():
    data = load_dataset(load_task_spec("sst2"))
    texts, where = public_queries.public_texts(data, "ood")
    assert where.endswith("rotten_tomatoes.dataset") and len(texts) > 5000
    source = {normalise_text(t) for t in list(data.train["text"]) + list(data.test["text"])}
    assert not any(normalise_text(t) in source for t in texts)  # the shipped SST-2 file's own sentences dropped


def test_public_file_errors(tmp_path, agnews):
    empty = tmp_path / "empty.csv"
    empty.write_text("text\n")
    with pytest.raises(DataValidationError, match="no records"):
        public_queries.public_texts(agnews, "file", str(empty))
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": "fine"}\n{"text": "  "}\n')
    with pytest.raises(DataValidationError, match="line 2"):
        public_queries.public_texts(agnews, "file", str(blank))
    leaking = tmp_path / "leak.parquet"
    pd.DataFrame({"text": ["a public sentence", agnews.train["text"].iloc[5].upper()]}).to_parquet(leaking)
    # a declared public file is read as it is: never compared with the private records (a free oracle)
    texts, where = public_queries.public_texts(agnews, "file", str(leaking))
    assert len(texts) == 2
    with pytest.raises(ConfigError, match="only 2 distinct"):
        public_queries.select_queries(texts, 3, where)


# ---------------------------------------------------------------- plan


SETTINGS = {"teachers": 200, "shots": 1, "threshold": 180.0, "sigma1": 40.0, "sigma2": 40.0, "repeats": 3,
            "queries": 500}


def _pld_epsilon(plan, delta: float) -> float:
    """An independent composition of a plan's spends: dp-accounting's PLD on its Gaussian steps."""
    from dp_accounting.dp_event import ComposedDpEvent, GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.pld import PLDAccountant

    accountant = PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(ComposedDpEvent([SelfComposedDpEvent(GaussianDpEvent(s.noise_multiplier), s.steps)
                                        for s in plan.spends]))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("epsilons, target", [([1.0, 8.0], 8.0), ([0.0, 2.0], 2.0), ([4.0, math.inf], math.inf)])
def test_pate_is_planned_at_the_runs_largest_epsilon(epsilons, target):
    from dpcore.config import RunConfig
    from tasks.pate import privacy_plans, target_epsilon

    config = RunConfig(dataset="sst2", methods=["tang", "pate"], epsilons=epsilons)
    assert target_epsilon(config) == target
    plans, per_repeat = privacy_plans(config, SETTINGS, 1e-6)
    assert [s.steps for s in plans[0].spends] == [3 * per_repeat, 3 * per_repeat]  # every repeat is charged
    if math.isinf(target):  # no cap: every query asked, at its data-independent bound
        assert per_repeat == 500
        return
    assert 1 < per_repeat < 500
    # charged at most the epsilon asked, by the ledger's composition and by dp-accounting's PLD (within 2%)
    assert plans[0].epsilon == plans[0].composed().epsilon <= target
    assert _pld_epsilon(plans[0], 1e-6) <= target * 1.02
    # and the most that fits: one more query in every repeat would pass it
    more = config.model_copy(update={"pate_target_epsilon": None, "epsilons": [math.inf]})
    over, _ = privacy_plans(more, {**SETTINGS, "queries": per_repeat + 1}, 1e-6)
    assert over[0].epsilon > target


def test_an_explicit_pate_epsilon_beats_the_runs():
    from dpcore.config import RunConfig
    from tasks.pate import privacy_plans

    config = RunConfig(dataset="sst2", methods=["pate"], epsilons=[8.0], pate_target_epsilon=2.0)
    plans, per_repeat = privacy_plans(config, SETTINGS, 1e-6)
    assert plans[0].epsilon <= 2.0 < privacy_plans(config.model_copy(update={"pate_target_epsilon": None}),
                                                   SETTINGS, 1e-6)[0][0].epsilon


def test_too_small_an_epsilon_is_refused_in_one_line():
    from dpcore.config import RunConfig
    from tasks.pate import privacy_plans

    config = RunConfig(dataset="sst2", methods=["pate"], epsilons=[8.0])
    with pytest.raises(ConfigError, match=r"at most 0 public queries per repeat within epsilon 0.0001") as err:
        privacy_plans(config.model_copy(update={"epsilons": [1e-4]}), SETTINGS, 1e-6)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="needs an epsilon > 0"):
        privacy_plans(config.model_copy(update={"epsilons": [0.0]}), SETTINGS, 1e-6)
    # a plan that can label at most one query per repeat can make no student: refused before any charge
    with pytest.raises(ConfigError, match="at most 1 public query per repeat, but a student prompt needs more than 1"):
        privacy_plans(config.model_copy(update={"epsilons": [math.inf]}), {**SETTINGS, "queries": 1}, 1e-6)
    baselines, _ = privacy_plans(config.model_copy(update={"pate_baselines": ["zero-shot", "ensemble"]}),
                                 SETTINGS, 1e-6)
    assert len(baselines) == 2 and baselines[1].spends[0].non_private and math.isinf(baselines[1].epsilon)


def test_presets_fill_only_the_unset_fields():
    from dpcore.config import RunConfig
    from dpcore.pate.presets import CPU_PRESET, GPU_PRESET
    from tasks.pate import pate_settings

    spec = load_task_spec("sst2")
    cpu = pate_settings(RunConfig(dataset="sst2", pate_preset="cpu"), spec, 1e-5)
    assert (cpu["preset"], cpu["teachers"], cpu["queries"], cpu["sigma1"], cpu["sigma2"], cpu["threshold"],
            cpu["student_candidates"]) == ("cpu", 20, 50, 10.0, 10.0, 18.0, 10)
    gpu = pate_settings(RunConfig(dataset="sst2", pate_preset="gpu"), spec, 1e-5)  # Table 7: E 200, Q 500, T 180
    assert (gpu["teachers"], gpu["queries"], gpu["sigma1"], gpu["sigma2"], gpu["threshold"]) == \
        (200, 500, spec.pate.sigma1, 20.0, 180.0)
    assert GPU_PRESET["teachers"] == 200 and CPU_PRESET["teachers"] < GPU_PRESET["teachers"]
    mine = pate_settings(RunConfig(dataset="sst2", pate_preset="gpu", pate_teachers=30, pate_sigma1=2.0,
                                   pate_queries=7, pate_student_candidates=3), spec, 1e-5)
    assert (mine["teachers"], mine["sigma1"], mine["queries"], mine["threshold"], mine["student_candidates"]) == \
        (30, 2.0, 7, 27.0, 3)
    assert pate_settings(RunConfig(dataset="sst2", device="cpu"), spec, 1e-5)["preset"] == "cpu"  # auto, by device
