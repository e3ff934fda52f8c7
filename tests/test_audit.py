"""Membership-inference audit and leakage checks."""

from __future__ import annotations

import math
from itertools import product
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpcore.audit import (
    MIA_SCORE_COLUMNS,
    AuditResult,
    GateThresholds,
    auc_mean_ci,
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_epsilon_lower_bound,
    epsilon_bounds_at,
    gate,
    null_auc_variance,
    roc_auc,
    roc_curve,
    roc_plot,
    tpr_at_fpr,
    verbatim_overlap,
    verbatim_overlap_tokens,
    whitespace_tokenize,
)
from dpcore.errors import ConfigError
from dpcore.mia_attacks import ATTACKS

# --------------------------------------------------------------------------- AUC and ROC


def brute_auc(members, non_members):
    wins = sum(1.0 if m > n else 0.5 if m == n else 0.0 for m, n in product(members, non_members))
    return wins / (len(members) * len(non_members))


def test_auc_hand_computed():
    # pairs (3,1) (3,2) (2,1) win, (2,2) ties: 3.5 / 4
    assert roc_auc([3, 2], [1, 2]) == pytest.approx(0.875)
    assert roc_auc([5, 6], [1, 2, 3]) == 1.0
    assert roc_auc([1, 2], [5, 6, 7]) == 0.0
    assert roc_auc([1, 1, 1], [1, 1]) == 0.5
    # one member against 50 non-members (Duan et al.'s trial): the fraction ranked below it
    assert roc_auc([0.7], list(np.linspace(0, 1, 50))) == pytest.approx(35 / 50)


def test_auc_matches_pairwise_count_with_ties():
    rng = np.random.default_rng(1)
    for _ in range(20):
        members = rng.integers(0, 6, size=rng.integers(1, 12))
        non_members = rng.integers(0, 6, size=rng.integers(1, 12))
        assert roc_auc(members, non_members) == pytest.approx(brute_auc(members, non_members))
        assert roc_curve(members, non_members).auc() == pytest.approx(brute_auc(members, non_members))


def test_roc_curve_points():
    curve = roc_curve([3, 2], [1, 2])
    assert curve.thresholds.tolist() == [math.inf, 3, 2, 1]
    assert curve.tpr.tolist() == [0, 0.5, 1, 1]
    assert curve.fpr.tolist() == [0, 0, 0.5, 1]


def test_tpr_at_fpr_hand_computed():
    members, non_members = [3, 2, 1.5], [1, 2, 0, 0.5]
    # threshold 3: TPR 1/3 at FPR 0; threshold 1.5: TPR 1 at FPR 1/4; threshold 1: FPR 1/2
    assert tpr_at_fpr(members, non_members, 0.0) == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, non_members, 0.2) == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, non_members, 0.25) == pytest.approx(1.0)
    # a tie at the top: no threshold separates it, so FPR 0 gives TPR 0
    assert tpr_at_fpr([5, 1], [5, 0], 0.0) == 0.0
    assert tpr_at_fpr([5, 1], [5, 0], 0.5) == 1.0  # threshold 1: both members, one non-member
    with pytest.raises(ConfigError, match="fpr"):
        tpr_at_fpr([1], [0], 1.5)


def test_scores_must_be_finite_and_present():
    with pytest.raises(ConfigError, match="member_scores"):
        roc_auc([], [1.0])
    with pytest.raises(ConfigError, match="non_member_scores"):
        roc_auc([1.0], [np.nan])


# --------------------------------------------------------------------------- epsilon lower bound


def test_clopper_pearson_closed_forms():
    alpha = 0.025
    assert clopper_pearson_lower(10, 10, alpha) == pytest.approx(alpha ** (1 / 10))
    assert clopper_pearson_upper(0, 100, alpha) == pytest.approx(1 - alpha ** (1 / 100))
    assert clopper_pearson_lower(0, 10, alpha) == 0.0
    assert clopper_pearson_upper(10, 10, alpha) == 1.0
    lo, hi = clopper_pearson_lower(30, 100, alpha), clopper_pearson_upper(30, 100, alpha)
    assert lo < 0.3 < hi and hi - lo < 0.2


def test_epsilon_bound_formula_hand_computed():
    alpha = 0.025
    tpr_lo = alpha ** (1 / 10)  # all 10 members flagged
    fpr_hi = 1 - alpha ** (1 / 100)  # no non-member of 100 flagged
    expected = max(math.log(tpr_lo / fpr_hi), math.log((1 - fpr_hi) / (1 - tpr_lo)))
    assert epsilon_bounds_at(10, 10, 0, 100, 0.0, alpha) == pytest.approx(expected)
    delta = 0.1
    expected_delta = max(math.log((tpr_lo - delta) / fpr_hi), math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    assert epsilon_bounds_at(10, 10, 0, 100, delta, alpha) == pytest.approx(expected_delta)
    # TPR_lo below delta and 1 - FPR_hi below delta: no bound at all
    assert epsilon_bounds_at(1, 100, 99, 100, 0.5, alpha) == -math.inf


def test_epsilon_bound_zero_for_identical_distributions():
    positives = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        members, non_members = rng.normal(size=500), rng.normal(size=500)
        bound = empirical_epsilon_lower_bound(members, non_members, delta=1e-3, confidence=0.95)
        assert bound.method == "holdout" and bound.epsilon >= 0
        positives += bound.epsilon > 0
    assert positives <= 6  # at 95% confidence about 2 of 40 may exceed 0 by chance
    rng = np.random.default_rng(0)
    bonferroni = empirical_epsilon_lower_bound(rng.normal(size=2000), rng.normal(size=2000), 0.0, 0.95,
                                               method="bonferroni")
    assert bonferroni.epsilon == pytest.approx(0.0, abs=0.05)


def test_epsilon_bound_large_for_separated_scores():
    members, non_members = np.linspace(1, 2, 1000), np.linspace(-1, 0, 1000)
    bound = empirical_epsilon_lower_bound(members, non_members, delta=0.0, confidence=0.95)
    # each holdout half: 500 vs 500, all separated: log(0.025^(1/500) / (1 - 0.025^(1/500)))
    q = 0.025 ** (1 / 500)
    assert bound.epsilon == pytest.approx(math.log(q / (1 - q)), rel=1e-6)
    bonferroni = empirical_epsilon_lower_bound(members, non_members, 0.0, 0.95, method="bonferroni")
    assert 3.5 < bonferroni.epsilon < bound.epsilon + 1
    # higher confidence, lower bound
    assert empirical_epsilon_lower_bound(members, non_members, 0.0, 0.999).epsilon < bound.epsilon


def test_epsilon_bound_groups_and_fallback():
    members, non_members = np.linspace(1, 2, 40), np.linspace(-1, 0, 40)
    grouped = empirical_epsilon_lower_bound(members, non_members, member_groups=np.arange(40) // 2,
                                            non_member_groups=np.arange(40) // 2)
    assert grouped.method == "holdout" and grouped.epsilon > 0
    single = empirical_epsilon_lower_bound(members, non_members, member_groups=np.zeros(40, int),
                                           non_member_groups=np.zeros(40, int))
    assert single.method == "bonferroni"
    with pytest.raises(ConfigError, match="confidence"):
        empirical_epsilon_lower_bound(members, non_members, confidence=1.0)


# --------------------------------------------------------------------------- AUC interval


def test_auc_interval():
    assert null_auc_variance(50, 50) == pytest.approx(101 / 30000)
    # agreeing trials cannot shrink the interval below the no-leakage spread (Hanley-McNeil floor)
    low, high = auc_mean_ci([0.5] * 20, 30, 30, 0.95)
    half = stats.t.ppf(0.975, 19) * math.sqrt(61 / (12 * 900) / 20)
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    # spread-out trials: the sample variance, Student t with n - 1 degrees of freedom
    values = np.array([0.2, 0.9, 0.4, 0.8, 0.6])
    low, high = auc_mean_ci(values, 50, 50, 0.9)
    half = stats.t.ppf(0.95, 4) * values.std(ddof=1) / math.sqrt(5)
    assert (low, high) == (pytest.approx(0.58 - half), pytest.approx(0.58 + half))
    assert all(math.isnan(v) for v in auc_mean_ci([0.5], 50, 50))
    # coverage under no leakage: simulated trials of 30 vs 30 from one distribution
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(200):
        aucs = [roc_auc(rng.normal(size=30), rng.normal(size=30)) for _ in range(10)]
        low, high = auc_mean_ci(aucs, 30, 30, 0.95)
        covered += low <= 0.5 <= high
    assert covered >= 0.92 * 200


# --------------------------------------------------------------------------- verbatim overlap


def brute_longest(demo, record):
    best = 0
    for i in range(len(demo)):
        for j in range(len(record)):
            k = 0
            while i + k < len(demo) and j + k < len(record) and demo[i + k] == record[j + k]:
                k += 1
            best = max(best, k)
    return best


def test_overlap_constructed_case():
    report = verbatim_overlap(
        ["a b c d e f g h i j", "x y z", "nothing shared"],
        ["q a b c d e f g h i r", "b c d e f g h i j k", "z y x", "a b c"],
        threshold=8,
    )
    assert report.max_overlap_tokens == (9, 1, 0)
    assert report.records_over_threshold == (2, 0, 0)
    assert report.overlapping_records == 2 and report.max_overlap == 9
    assert report.tokenizer == "whitespace"
    below = verbatim_overlap(["a b c d e f g h i j"], ["a b c d e f g x"], threshold=8)
    assert below.max_overlap_tokens == (7,) and below.overlapping_records == 0


def test_overlap_matches_brute_force():
    rng = np.random.default_rng(3)
    for threshold in (1, 3, 5):
        records = [rng.integers(0, 4, size=rng.integers(0, 15)).tolist() for _ in range(30)]
        demos = [rng.integers(0, 4, size=rng.integers(1, 12)).tolist() for _ in range(6)]
        demos.append(records[2] + records[3])  # crosses a record boundary: must not join the two
        report = verbatim_overlap_tokens(demos, records, threshold)
        for d, demo in enumerate(demos):
            longest = [brute_longest(demo, record) for record in records]
            assert report.max_overlap_tokens[d] == max(longest)
            assert report.records_over_threshold[d] == sum(v >= threshold for v in longest)
        over = {r for r, record in enumerate(records) if any(brute_longest(d, record) >= threshold for d in demos)}
        assert report.overlapping_records == len(over)


def test_overlap_edge_cases():
    assert verbatim_overlap_tokens([], [[1, 2]], 8).max_overlap == 0
    assert verbatim_overlap_tokens([[1, 2]], [], 8).max_overlap_tokens == (0,)
    assert verbatim_overlap_tokens([[]], [[1, 2]], 8).max_overlap_tokens == (0,)
    assert verbatim_overlap_tokens([[7] * 20], [[7] * 30], 8).max_overlap_tokens == (20,)
    with pytest.raises(ConfigError, match="overlap_threshold"):
        verbatim_overlap_tokens([[1]], [[1]], 0)
    assert whitespace_tokenize(["a b", "b  a\nc"]) == [[0, 1], [1, 0, 2]]


def test_overlap_scales_to_100k_records():
    import time

    rng = np.random.default_rng(0)
    records = [rng.integers(0, 49152, size=40).tolist() for _ in range(100_000)]
    demos = [rng.integers(0, 49152, size=40).tolist() for _ in range(8)]
    demos.append(records[123][5:30])
    began = time.perf_counter()
    report = verbatim_overlap_tokens(demos, records, 8)
    assert time.perf_counter() - began < 20  # about 2 s here
    assert report.max_overlap_tokens[-1] == 25 and report.records_over_threshold[-1] == 1
    assert max(report.max_overlap_tokens[:-1]) < 8


# --------------------------------------------------------------------------- gate


def _result(**overrides):
    values = dict(auc=0.5, auc_ci=(0.48, 0.52), confidence=0.95, max_overlap_tokens=3, overlapping_records=0,
                  crosscheck_agreed=True)
    values.update(overrides)
    return SimpleNamespace(**values)


def test_gate_passes_a_clean_result():
    assert gate(_result()) == (True, ())


def test_gate_reasons_one_per_condition():
    passed, reasons = gate(_result(auc=0.81, auc_ci=(0.77, 0.85), max_overlap_tokens=42, overlapping_records=3,
                                   crosscheck_agreed=False))
    assert not passed and len(reasons) == 3
    assert "AUC 0.810 (95% CI [0.770, 0.850]) of the duan attack is outside 0.5 +/- 0.05" in reasons[0]
    assert "42 consecutive tokens" in reasons[1] and "3 record(s) at >= 8 tokens" in reasons[1]
    assert "cross-check disagreed" in reasons[2]
    assert all("\n" not in reason for reason in reasons)
    # a score ranking members LOWER is a distinguisher too
    assert not gate(_result(auc=0.4, auc_ci=(0.38, 0.42)))[0]
    # an audit too small to resolve the band is inconclusive, not a pass
    passed, reasons = gate(_result(auc=0.52, auc_ci=(0.40, 0.64)))
    assert not passed and reasons[0].startswith("audit inconclusive")
    passed, reasons = gate(_result(auc_ci=(math.nan, math.nan)))
    assert not passed and "undefined" in reasons[0]
    # no accountant (real records in the prompt)
    passed, reasons = gate(_result(crosscheck_agreed=None))
    assert not passed and "not differentially private" in reasons[0]
    assert gate(_result(crosscheck_agreed=None), GateThresholds(require_crosscheck=False))[0]
    # configurable thresholds
    assert gate(_result(auc=0.56, auc_ci=(0.54, 0.58)), GateThresholds(auc_tolerance=0.1))[0]
    assert not gate(_result(max_overlap_tokens=5), GateThresholds(overlap_threshold=5))[0]


# --------------------------------------------------------------------------- result tables and plot


def _fake_result(setting, member_shift, seed=0):
    rng = np.random.default_rng(seed)
    members, non_members = rng.normal(member_shift, 1, 100), rng.normal(0, 1, 400)
    scores = pd.DataFrame({
        "setting": setting, "epsilon": 1.0, "demo_set": 0, "trial": np.arange(500) % 10,
        "role": ["member"] * 100 + ["non_member"] * 400, "member": [True] * 100 + [False] * 400,
        "record_id": [f"r{i}" for i in range(500)], "attack": "duan",
        "score": np.concatenate([members, non_members]),
    })
    return AuditResult(
        setting=setting, epsilon=1.0, noise_multiplier=0.5, delta=1e-4, auc=roc_auc(members, non_members),
        auc_ci=(0.4, 0.6), trial_aucs=(0.5, 0.5), trials=2, demo_sets=1, members_per_trial=50,
        non_members_per_trial=200, tpr_at_1pct_fpr=0.0, tpr_at_01pct_fpr=0.0, pooled_auc=0.5,
        epsilon_lower_bound=0.0, confidence=0.95, max_overlap_tokens=2, overlapping_records=0,
        overlap_threshold=8, crosscheck_agreed=True, model="m", dataset="d", seconds=1.0,
        passed=False, reasons=("first reason", "second reason"), mia_scores=scores,
    )


def test_audit_frame_and_summary(tmp_path):
    result = _fake_result("dp", 0.0)
    frame = result.audit_frame()
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["reasons"] == "first reason\nsecond reason" and not row["passed"]
    assert row["auc_ci_low"] == 0.4 and row["auc_ci_high"] == 0.6
    assert "mia_scores" not in frame.columns and "text" not in frame.columns
    from dpcore.artifacts import read_table, write_table

    write_table(frame, tmp_path / "audit.parquet")
    assert read_table(tmp_path / "audit.parquet")["reasons"].iloc[0].splitlines() == ["first reason", "second reason"]
    summary = result.summary()
    assert summary["reasons"] == ["first reason", "second reason"] and summary["auc_ci"] == [0.4, 0.6]
    assert list(result.mia_scores.columns) == MIA_SCORE_COLUMNS


def test_roc_plot_writes_png_atomically(tmp_path):
    path = roc_plot([_fake_result("non-private", 2.0), _fake_result("dp", 0.0, seed=1)], tmp_path / "roc.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["roc.png"]


# --------------------------------------------------------------------------- the attack (tiny model)


@pytest.fixture()
def one_thread():
    """The tiny model's ops are too small to share between threads on a loaded 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def agnews_sample(agnews):
    return agnews.train.sample(n=8000, random_state=0).reset_index(drop=True)


def _no_text(frame: pd.DataFrame, texts: list[str]) -> bool:
    cells = {str(v) for column in frame.columns for v in frame[column].tolist()}
    return not (cells & set(texts))


def test_membership_score_is_normalised_true_label_probability(tiny_lm, agnews, one_thread):
    from dpcore.audit import membership_scores
    from dpcore.icl import label_logprobs

    rows = agnews.train.head(5)
    demos = [(rows.text[0], rows.label[0])]
    scores = membership_scores(tiny_lm, agnews.spec, demos, rows.text.tolist(), rows.label.tolist())
    logp = label_logprobs(tiny_lm, agnews.spec, demos, rows.text.tolist())
    probs = np.exp(logp) / np.exp(logp).sum(axis=1, keepdims=True)
    index = [agnews.spec.label_names.index(y) for y in rows.label]
    assert np.allclose(scores, probs[np.arange(5), index])


def test_non_private_audit_structure(tiny_lm, agnews, agnews_sample, one_thread):
    from dpcore.audit import non_private_audit
    from dpcore.config import AuditConfig

    config = AuditConfig(trials=4, non_members=12)
    result = non_private_audit(tiny_lm, agnews.spec, agnews_sample, config, seed=7)
    again = non_private_audit(tiny_lm, agnews.spec, agnews_sample, config, seed=7)
    scores = result.mia_scores
    assert list(scores.columns) == MIA_SCORE_COLUMNS and len(scores) == len(ATTACKS) * 4 * 13
    assert list(dict.fromkeys(scores["attack"])) == list(ATTACKS)
    duan = scores.loc[scores["attack"] == "duan"]
    assert duan.groupby("trial")["member"].sum().tolist() == [1, 1, 1, 1]
    assert duan["record_id"].is_unique  # trials draw disjoint records
    assert np.allclose(scores["score"], again.mia_scores["score"]) and result.auc == again.auc
    assert len(result.trial_aucs) == 4 and result.auc == pytest.approx(np.mean(result.trial_aucs))
    assert [a.attack for a in result.attacks] == list(ATTACKS)
    assert result.attack == max(result.attacks, key=lambda a: abs(a.auc - 0.5)).attack
    # the duan attack's score is still Duan et al.'s normalised label probability
    from dpcore.audit import membership_scores

    trial0 = duan.loc[duan["trial"] == 0]
    rows = agnews_sample.set_index("id").loc[trial0["record_id"]]
    expected = membership_scores(tiny_lm, agnews.spec, [(rows["text"].iloc[0], rows["label"].iloc[0])],
                                 rows["text"].tolist(), rows["label"].tolist())
    assert np.allclose(trial0["score"], expected, atol=1e-5)
    assert _no_text(scores, agnews_sample["text"].tolist())
    # real records as demos: the verbatim check sees the copies; no accountant applies
    assert not result.passed and result.max_overlap_tokens >= 8
    assert any("verbatim overlap" in r for r in result.reasons)
    assert any("not differentially private" in r for r in result.reasons)
    frame = result.audit_frame()
    assert frame["setting"].iloc[0] == "non-private" and _no_text(frame, agnews_sample["text"].tolist())


def test_dp_audit_no_false_alarms_on_tiny_model(tiny_lm, agnews, agnews_sample, one_thread, monkeypatch):
    """Nothing leaks through a random tiny model's DP demos: the AUC interval covers 0.5 in nearly all runs."""
    from dpcore import generation
    from dpcore.audit import dp_audit, split_members
    from dpcore.config import AuditConfig, GenerationConfig

    members, non_members = split_members(agnews_sample, seed=0)
    assert len(members) == 4000 and set(members["id"]).isdisjoint(non_members["id"])
    config = AuditConfig(trials=10, demo_sets=2, members=40, non_members=40, reference_prompts=2,
                         max_record_tokens=16)
    gen = GenerationConfig(num_subsets=4, subset_size=1, max_tokens=6, top_k=20)
    events = []
    original = generation.generate_demos

    def spy(lm, spec, records_by_label, *args, **kwargs):
        assert list(records_by_label) == kwargs["labels"]  # one label, its members only
        label = kwargs["labels"][0]
        assert set(records_by_label[label]) <= set(members.loc[members["label"] == label, "text"])
        events.append("generate")
        return original(lm, spec, records_by_label, *args, **kwargs)

    monkeypatch.setattr(generation, "generate_demos", spy)
    covered, flagged, runs = 0, 0, 4
    for run in range(runs):
        result = dp_audit(tiny_lm, agnews.spec, members, non_members, config, gen, 0.5, seed=run,
                          epsilon=1.0, delta=1e-4, crosscheck_agreed=True, noise_seed=run,
                          charge=lambda demo_set: events.append(f"charge {demo_set}"))
        low, high = result.auc_ci
        covered += low <= 0.5 <= high
        flagged += any("AUC" in reason and "outside" in reason for reason in result.reasons)
        assert result.trials == 20 and result.demo_sets == 2 and result.setting == "dp"
        assert high - low <= 2 * config.auc_tolerance  # large enough to be conclusive
        assert result.epsilon_lower_bound < 1.0
        assert result.max_overlap_tokens < 8
    assert covered >= runs - 1 and flagged == 0
    assert events[:4] == ["charge 0", "generate", "charge 1", "generate"]  # the ledger hook runs first
    scores = result.mia_scores
    assert len(scores) == len(ATTACKS) * 2 * 10 * 80
    assert scores.groupby(["attack", "demo_set", "trial"])["member"].sum().unique().tolist() == [40]
    for attack in result.attacks:  # every attack, not only the gate's, stays in the band
        assert abs(attack.auc - 0.5) <= config.auc_tolerance and 0 <= attack.auc_ci[0] <= attack.auc_ci[1] <= 1
    assert _no_text(scores, agnews_sample["text"].tolist())


# --------------------------------------------------------------------------- CLI (tiny model)


@pytest.fixture(scope="module")
def mini_task(agnews, tmp_path_factory):
    """A 2,000-record AG News file with its task spec (a small user dataset), and the tiny model's folder."""
    import yaml

    folder = tmp_path_factory.mktemp("audit-cli")
    records = agnews.train.groupby("label").head(550)[["id", "text", "label"]]
    records.to_csv(folder / "mini.csv", index=False)
    spec = agnews.spec.model_dump(mode="json")
    spec.update(name="agnews-mini", source={"type": "file", "path": str(folder / "mini.csv")},
                split={"test_size": 0.1, "seed": 0})
    (folder / "mini.yaml").write_text(yaml.safe_dump(spec))
    return folder, records


def _cli(argv, capsys):
    import json

    from flows.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if "--json" in argv and code in (0, 1) else captured.out), captured.err


def _private_folder(out):
    """The private counterpart of a CLI output folder (same folder name under $DPICL_HOME/private/runs)."""
    from dpcore.home import private_dir

    found = [p for p in (private_dir() / "runs").rglob(out.name) if p.is_dir()]
    assert len(found) == 1
    return found[0]


def test_cli_dp_audit_writes_tables_and_charges_ledger(mini_task, tiny_model_dir, tmp_path, capsys, one_thread):
    from dpcore.artifacts import read_table
    from dpcore.ledger import Ledger

    folder, records = mini_task
    out = tmp_path / "audit"
    code, summary, _ = _cli(["audit", "--task-spec", str(folder / "mini.yaml"), "--data-path", str(folder / "mini.csv"),
                             "--epsilon", "4", "--model", str(tiny_model_dir), "--trials", "3",
                             "--audit-members", "10", "--audit-demo-sets", "2", "--max-tokens", "4",
                             "--num-subsets", "2", "--subset-size", "1", "--top-k", "10", "--seed", "1",
                             "--dataset-id", "audit-cli-test", "--out", str(out), "--json"], capsys)
    for key in ("auc", "tpr_at_1pct_fpr", "epsilon_lower_bound", "max_overlap_tokens", "passed", "reasons"):
        assert key in summary
    assert code == (0 if summary["passed"] else 1)
    assert not summary["passed"] and any("inconclusive" in r for r in summary["reasons"])  # 6 trials are too few
    assert summary["privacy"]["noise_multiplier"] > 0 and summary["privacy"]["epsilon"] <= 4
    assert {p.name for p in out.iterdir()} >= {"audit.parquet", "roc.png", "audit.json", "manifest.json"}
    assert not (out / "mia_scores.parquet").exists()  # per-record scores: private store only
    private = _private_folder(out)
    scores, audit = read_table(private / "mia_scores.parquet"), read_table(out / "audit.parquet")
    assert len(scores) == len(ATTACKS) * 2 * 3 * 20 and len(audit) == 1 and not audit["passed"].iloc[0]
    assert set(scores["attack"]) == set(ATTACKS) and summary["attack"] in ATTACKS
    assert [a["attack"] for a in summary["attacks"]] == list(ATTACKS)
    assert {f"auc_{name.replace('-', '_')}" for name in ATTACKS} <= set(audit.columns)
    texts = records["text"].tolist()
    assert _no_text(scores, texts) and _no_text(audit, texts)
    assert not any(text in (out / "audit.json").read_text() for text in texts)
    entries = [e for e in Ledger().entries("audit-cli-test") if e.run_id == out.name]
    assert len(entries) == 2 and {e.purpose for e in entries} == {"audit"}  # one charge per demo set


def test_cli_non_private_instruction_only_reference_and_bad_input(mini_task, tiny_model_dir, tmp_path, capsys,
                                                                  one_thread):
    from dpcore.artifacts import read_table

    folder, _ = mini_task
    base = ["audit", "--task-spec", str(folder / "mini.yaml"), "--data-path", str(folder / "mini.csv"),
            "--model", str(tiny_model_dir)]
    code, text, _ = _cli(base + ["--non-private", "--trials", "3", "--audit-members", "10",
                                 "--out", str(tmp_path / "np")], capsys)
    assert code == 1 and "gate: FAILED" in text and "  - verbatim overlap" in text
    from dpcore.ledger import Ledger

    charged = [e for e in Ledger().entries("agnews-mini") if e.run_id == "np"]  # real records in prompts: inf
    assert [(e.noise_multiplier, e.purpose) for e in charged] == [(0.0, "baseline")]
    # epsilon 0: instruction-only demos (nothing charged), with the non-private reference alongside
    code, summary, _ = _cli(base + ["--epsilon", "0", "--trials", "2", "--audit-members", "10", "--audit-demo-sets",
                                    "1", "--max-tokens", "4", "--top-k", "10", "--reference", "--seed", "3",
                                    "--out", str(tmp_path / "eps0"), "--json"], capsys)
    # the instruction-only demos charge nothing; the non-private reference is one infinite spend
    assert summary["setting"] == "instruction-only" and summary["ledger_entries"] == 1
    assert summary["reference"]["setting"] == "non-private" and not summary["reference"]["passed"]
    scores = read_table(_private_folder(tmp_path / "eps0") / "mia_scores.parquet")
    assert (_private_folder(tmp_path / "eps0") / "roc.png").exists()  # the ROC with the non-private curve
    assert set(scores["setting"]) == {"instruction-only", "non-private"}
    assert (tmp_path / "eps0" / "audit_reference.parquet").exists()
    code, _, err = _cli(base + ["--non-private", "--trials", "0"], capsys)
    assert code == 2 and "trials" in err
    with pytest.raises(SystemExit):
        _cli(base + ["--non-private", "--epsilon", "1"], capsys)


# --------------------------------------------------------------------------- the leak


def test_copying_model_with_real_demos_fails_the_gate(tiny_lm, agnews, agnews_sample, monkeypatch):
    """A model that recognises its own demonstration (Duan et al.'s leak, exaggerated) is caught on every count."""
    import zlib

    from dpcore import mia_attacks
    from dpcore.audit import non_private_audit
    from dpcore.config import AuditConfig

    labels = agnews.spec.label_names

    def copying_prompt_scores(lm, spec, demos, queries, labels_, batch_size=16):
        label_lp, text_lp = [], []
        for query, label in zip(queries, labels_, strict=True):
            if any(query == demo[0] for demo in demos):  # a member: the demo's label, confidently; its text copied
                probs = np.full(len(labels), 0.02)
                probs[labels.index(demos[0][1])] = 0.94
                text = -5.0
            else:  # anyone else: an arbitrary but fixed guess
                probs = np.random.default_rng(zlib.crc32(query.encode())).dirichlet(np.ones(len(labels)))
                text = -40.0 + zlib.crc32(query.encode()) % 100 / 10
            p = probs[labels.index(label)]
            label_lp.append(np.log(p))
            text_lp.append(text)
        label_lp = np.array(label_lp)
        return mia_attacks.PromptScores(label_lp, label_lp - np.log1p(-np.exp(label_lp)), np.array(text_lp))

    monkeypatch.setattr(mia_attacks, "prompt_scores", copying_prompt_scores)
    result = non_private_audit(tiny_lm, agnews.spec, agnews_sample, AuditConfig(trials=100, non_members=50),
                               seed=0, overlap_records=agnews_sample.head(100))
    assert result.auc > 0.9 and result.auc_ci[0] > 0.55
    assert result.tpr_at_1pct_fpr > 0.5 and result.epsilon_lower_bound > 1.0
    assert not result.passed
    assert result.reasons[0].startswith("membership-inference AUC") and "outside 0.5 +/- 0.05" in result.reasons[0]
    assert any(r.startswith("verbatim overlap") for r in result.reasons)
