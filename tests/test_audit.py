"""The membership-inference audit (dpcore.audit.procedures): result tables, the attack procedures, the CLI, a planted leak."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pandas as pd
import pytest

from dpcore.audit import attacks as mia_attacks
from dpcore.audit import procedures
from dpcore.audit.attacks import ATTACKS, CALIBRATED_ATTACKS, PromptScores
from dpcore.audit.procedures import MIA_SCORE_COLUMNS

# --------------------------------------------------------------------------- result tables


def test_audit_frame_and_summary(tmp_path, fake_audit_result):
    result = fake_audit_result("dp", 0.0)
    frame = result.audit_frame()
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["reasons"] == "first reason\nsecond reason" and not row["passed"]
    assert row["auc_ci_low"] == 0.4 and row["auc_ci_high"] == 0.6
    assert "mia_scores" not in frame.columns and "text" not in frame.columns
    from dpcore.data.artifacts import read_table, write_table

    write_table(frame, tmp_path / "audit.parquet")
    assert read_table(tmp_path / "audit.parquet")["reasons"].iloc[0].splitlines() == ["first reason", "second reason"]
    summary = result.summary()
    assert summary["reasons"] == ["first reason", "second reason"] and summary["auc_ci"] == [0.4, 0.6]
    assert list(result.mia_scores.columns) == MIA_SCORE_COLUMNS


# --------------------------------------------------------------------------- the attack (tiny model)


@pytest.fixture(scope="module")
def agnews_sample(agnews):
    return agnews.train.sample(n=8000, random_state=0).reset_index(drop=True)


def _no_text(frame: pd.DataFrame, texts: list[str]) -> bool:
    cells = {str(v) for column in frame.columns for v in frame[column].tolist()}
    return not (cells & set(texts))


def _true_label_probability(lm, spec, demos, texts, labels) -> np.ndarray:
    """Duan et al.'s score computed the ICL evaluation's way: p(true label | prompt, x), normalised."""
    from dpcore.lm.icl import label_logprobs

    logp = label_logprobs(lm, spec, demos, list(texts))
    probs = np.exp(logp) / np.exp(logp).sum(axis=1, keepdims=True)
    return probs[np.arange(len(texts)), [spec.label_names.index(y) for y in labels]]


def test_duan_score_is_normalised_true_label_probability(tiny_lm, agnews, one_thread):
    from dpcore.audit.attacks import prompt_scores

    rows = agnews.train.head(5)
    demos = [(rows.text[0], rows.label[0])]
    scores = prompt_scores(tiny_lm, agnews.spec, demos, rows.text.tolist(), rows.label.tolist())
    expected = _true_label_probability(tiny_lm, agnews.spec, demos, rows.text.tolist(), rows.label.tolist())
    assert np.allclose(np.exp(scores.label_logprob), expected, atol=1e-5)


def test_non_private_audit_structure(tiny_lm, agnews, agnews_sample, one_thread):
    from dpcore.audit.config import AuditConfig
    from dpcore.audit.procedures import non_private_audit

    # 4 trials of 13 records: a thousand records fill them, and the verbatim check (every record by default)
    # tokenizes an eighth of the sample's
    records = agnews_sample.head(1000)
    config = AuditConfig(trials=4, non_members=12)
    result = non_private_audit(tiny_lm, agnews.spec, records, config, seed=7)
    again = non_private_audit(tiny_lm, agnews.spec, records, config, seed=7)
    scores = result.mia_scores
    # the default audit: the three calibrated attacks (no OUT prompt, no LiRA)
    assert list(scores.columns) == MIA_SCORE_COLUMNS and len(scores) == len(CALIBRATED_ATTACKS) * 4 * 13
    assert list(dict.fromkeys(scores["attack"])) == list(CALIBRATED_ATTACKS)
    duan = scores.loc[scores["attack"] == "duan"]
    assert duan.groupby("trial")["member"].sum().tolist() == [1, 1, 1, 1]
    assert duan["record_id"].is_unique  # trials draw disjoint records
    assert np.allclose(scores["score"], again.mia_scores["score"]) and result.auc == again.auc
    assert len(result.trial_aucs) == 4 and result.auc == pytest.approx(np.mean(result.trial_aucs))
    assert [a.attack for a in result.attacks] == list(CALIBRATED_ATTACKS)
    assert result.attack == max(result.attacks, key=lambda a: abs(a.auc - 0.5)).attack
    # the duan attack's score is still Duan et al.'s normalised label probability
    trial0 = duan.loc[duan["trial"] == 0]
    rows = records.set_index("id").loc[trial0["record_id"]]
    expected = _true_label_probability(tiny_lm, agnews.spec, [(rows["text"].iloc[0], rows["label"].iloc[0])],
                                       rows["text"].tolist(), rows["label"].tolist())
    assert np.allclose(trial0["score"], expected, atol=1e-5)
    assert _no_text(scores, records["text"].tolist())
    # real records as demos: the verbatim check sees the copies; no accountant applies
    assert not result.passed and result.max_overlap_tokens >= 8
    assert any("verbatim overlap" in r for r in result.reasons)
    assert any("not differentially private" in r for r in result.reasons)
    frame = result.audit_frame()
    assert frame["setting"].iloc[0] == "non-private" and _no_text(frame, records["text"].tolist())


def test_dp_audit_no_false_alarms_on_tiny_model(tiny_lm, agnews, agnews_sample, one_thread, monkeypatch):
    """Nothing leaks through a random tiny model's DP demos: the AUC interval covers 0.5 in nearly all runs."""
    from dpcore.audit.config import AuditConfig
    from dpcore.audit.procedures import dp_audit, split_members
    from dpcore.fewshot import generation
    from dpcore.fewshot.config import GenerationConfig

    members, non_members = split_members(agnews_sample, seed=0)
    halves = sum(int(round(n / 2)) for n in agnews_sample["label"].value_counts())  # half of each label
    assert len(members) == halves and set(members["id"]).isdisjoint(non_members["id"])
    # Each record's first 4 tokens: the scoring costs one pass of the tiny model's 49k-word head per token
    # (measured, both audits: 8 tokens 27 s of CPU; 4, in batches of 64 and with the cache shared below, 14 s);
    # the interval's width depends on the record counts and trials (Hanley-McNeil), which are unchanged: 0.074
    # with any cap.
    config = AuditConfig(trials=12, demo_sets=2, members=40, non_members=40, reference_prompts=2,
                         max_record_tokens=4)
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
    # Two seeded audits, each interval must cover 0.5 (four allowing one miss before): an interval half as
    # wide as it should be misses with probability about 1/2 per audit, caught with probability 3/4 by two
    # audits that must both cover (11/16 by four allowing one miss); a valid 95% interval fails it <= 10%.
    # The audits share the reference cache, as a run's epsilons do: a record both audits draw is scored without
    # demonstrations once (its scores are the same either way: test_reference_scores_are_reused_...).
    covered, flagged, runs, cache = 0, 0, 2, {}
    for run in range(runs):
        result = dp_audit(tiny_lm, agnews.spec, members, non_members, config, gen, 0.5, seed=run,
                          epsilon=1.0, delta=1e-4, crosscheck_agreed=True, noise_seed=run,
                          charge=lambda demo_set: events.append(f"charge {demo_set}"), batch_size=64, cache=cache)
        low, high = result.auc_ci
        covered += low <= 0.5 <= high
        flagged += any("AUC" in reason and "outside" in reason for reason in result.reasons)
        assert result.trials == 24 and result.demo_sets == 2 and result.setting == "dp"
        assert high - low <= 2 * config.auc_tolerance  # large enough to be conclusive
        assert result.epsilon_lower_bound < 1.0
        assert result.max_overlap_tokens < 8
    assert covered == runs and flagged == 0
    assert events[:4] == ["charge 0", "generate", "charge 1", "generate"]  # the ledger hook runs first
    scores = result.mia_scores
    assert len(scores) == len(ATTACKS) * 2 * 12 * 80
    assert scores.groupby(["attack", "demo_set", "trial"])["member"].sum().unique().tolist() == [40]
    for attack in result.attacks:  # every attack, not only the gate's, stays in the band
        assert abs(attack.auc - 0.5) <= config.auc_tolerance and 0 <= attack.auc_ci[0] <= attack.auc_ci[1] <= 1
    assert _no_text(scores, agnews_sample["text"].tolist())


# --------------------------------------------------------------------------- CLI (tiny model)


@pytest.fixture(scope="module")
def mini_task(agnews, tmp_path_factory):
    """A 600-record AG News file with its task spec (a small user dataset): 135 private records a label, so the
    audits below fill their trials with disjoint records."""
    import yaml

    folder = tmp_path_factory.mktemp("audit-cli")
    records = agnews.train.groupby("label").head(150)[["id", "text", "label"]]
    records.to_csv(folder / "mini.csv", index=False)
    spec = agnews.spec.model_dump(mode="json")
    spec.update(name="agnews-mini", source={"type": "file", "path": str(folder / "mini.csv")},
                split={"test_size": 0.1, "seed": 0})
    (folder / "mini.yaml").write_text(yaml.safe_dump(spec))
    return folder, records


def _private_folder(out):
    """The private counterpart of a CLI output folder (same folder name under $DPICL_HOME/private/runs)."""
    from dpcore.home import private_dir

    found = [p for p in (private_dir() / "runs").rglob(out.name) if p.is_dir()]
    assert len(found) == 1
    return found[0]


def test_cli_dp_audit_writes_tables_and_charges_ledger(mini_task, tiny_model_dir, tmp_path, cli, one_thread):
    from dpcore.data.artifacts import read_table
    from dpcore.privacy.ledger import Ledger

    folder, records = mini_task
    out = tmp_path / "audit"
    code, stdout, _ = cli(["audit", "--task-spec", str(folder / "mini.yaml"), "--data-path", str(folder / "mini.csv"),
                           "--epsilon", "4", "--model", str(tiny_model_dir), "--trials", "3",
                           "--audit-members", "10", "--audit-demo-sets", "2", "--max-tokens", "4",
                           "--num-subsets", "2", "--subset-size", "1", "--top-k", "10", "--seed", "1",
                           "--audit-reference-prompts", "4",  # LiRA, asked for: all five attacks
                           "--audit-max-record-tokens", "16",  # the tables are under test: scoring a third of it
                           "--audit-test", "equivalence",  # the band: 6 trials cannot resolve it
                           "--dataset-id", "audit-cli-test", "--out", str(out), "--json"])
    summary = json.loads(stdout)
    for key in ("verdict", "passed", "reasons", "trials", "members_per_trial", "confidence", "test", "leak_auc",
                "power", "false_alarm"):
        assert key in summary
    # every figure of the audit is a statistic of private records: never in --json or the public folder
    for key in ("auc", "auc_ci", "attack", "attacks", "tpr_at_1pct_fpr", "epsilon_lower_bound", "max_overlap_tokens"):
        assert key not in summary
    assert code == (0 if summary["passed"] else 1)
    assert not summary["passed"] and any("inconclusive" in r for r in summary["reasons"])  # 6 trials are too few
    assert summary["verdict"] in ("inconclusive", "failed")
    assert summary["privacy"]["noise_multiplier"] > 0 and summary["privacy"]["epsilon"] <= 4
    assert {p.name for p in out.iterdir()} >= {"audit.parquet", "audit.json", "manifest.json"}
    assert not (out / "mia_scores.parquet").exists() and not (out / "roc.png").exists()  # private store only
    private = _private_folder(out)
    scores, audit = read_table(private / "mia_scores.parquet"), read_table(out / "audit.parquet")
    assert len(scores) == len(ATTACKS) * 2 * 3 * 20 and len(audit) == 1 and not audit["passed"].iloc[0]
    assert not {"auc", "auc_ci_low", "tpr_at_1pct_fpr", "max_overlap_tokens", "attack"} & set(audit.columns)
    diagnostic = json.loads((private / "audit.json").read_text())
    assert set(scores["attack"]) == set(ATTACKS) and diagnostic["attack"] in ATTACKS
    assert [a["attack"] for a in diagnostic["attacks"]] == list(ATTACKS)
    assert {f"auc_{name.replace('-', '_')}" for name in ATTACKS} <= set(read_table(private / "audit.parquet").columns)
    assert (private / "roc.png").exists()
    texts = records["text"].tolist()
    assert _no_text(scores, texts) and _no_text(audit, texts)
    assert not any(text in (out / "audit.json").read_text() for text in texts)
    entries = [e for e in Ledger().entries("audit-cli-test") if e.run_id == out.name]
    assert len(entries) == 2 and {e.purpose for e in entries} == {"audit"}  # one charge per demo set


def test_cli_non_private_instruction_only_reference_and_bad_input(mini_task, tiny_model_dir, tmp_path, cli,
                                                                  one_thread):
    from dpcore.data.artifacts import read_table

    folder, _ = mini_task
    base = ["audit", "--task-spec", str(folder / "mini.yaml"), "--data-path", str(folder / "mini.csv"),
            "--model", str(tiny_model_dir), "--audit-max-record-tokens", "16"]
    # sized as the gate needs (the fewest trials that detect the default leak), not by a fixed trial count
    code, text, err = cli(base + ["--non-private", "--out", str(tmp_path / "np")])
    assert code == 1 and "gate: FAILED" in text and "  - verbatim overlap" in text
    assert "on 35 trials of 1 member(s) vs 4 non-members; detects a leak of AUC 0.75 with power 0.95" in err
    from dpcore.privacy.ledger import Ledger

    charged = [e for e in Ledger().entries("agnews-mini") if e.run_id == "np"]  # real records in prompts: inf
    assert [(e.noise_multiplier, e.purpose) for e in charged] == [(0.0, "baseline")]
    # epsilon 0: instruction-only demos (nothing charged), with the non-private reference alongside
    code, stdout, _ = cli(base + ["--epsilon", "0", "--trials", "2", "--audit-members", "10", "--audit-demo-sets",
                                  "1", "--max-tokens", "4", "--top-k", "10", "--reference", "--seed", "3",
                                  "--out", str(tmp_path / "eps0"), "--json"])
    summary = json.loads(stdout)
    # the instruction-only demos charge nothing; the non-private reference is one infinite spend
    assert summary["setting"] == "instruction-only" and summary["ledger_entries"] == 1
    assert summary["reference"]["setting"] == "non-private" and not summary["reference"]["passed"]
    scores = read_table(_private_folder(tmp_path / "eps0") / "mia_scores.parquet")
    assert (_private_folder(tmp_path / "eps0") / "roc.png").exists()  # the ROC with the non-private curve
    assert set(scores["setting"]) == {"instruction-only", "non-private"}
    assert (tmp_path / "eps0" / "audit_reference.parquet").exists()
    code, _, err = cli(base + ["--non-private", "--trials", "0"])
    assert code == 2 and "trials" in err
    with pytest.raises(SystemExit):
        cli(base + ["--non-private", "--epsilon", "1"])


# --------------------------------------------------------------------------- the leak


def test_copying_model_with_real_demos_fails_the_gate(tiny_lm, agnews, agnews_sample, monkeypatch):
    """A model that recognises its own demonstration (Duan et al.'s leak, exaggerated) is caught on every count."""
    import zlib

    from dpcore.audit import attacks as mia_attacks
    from dpcore.audit.config import AuditConfig
    from dpcore.audit.procedures import non_private_audit

    labels = agnews.spec.label_names

    def copying_prompt_scores(lm, spec, demos, queries, labels_, batch_size=16, past=None, should_stop=None):
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
    # 50 trials of 1 member and 50 non-members: the leak is caught with room to spare (AUC 1.0, its interval
    # from 0.90, empirical epsilon 5; 0.93 and 6 at 100 trials)
    result = non_private_audit(tiny_lm, agnews.spec, agnews_sample, AuditConfig(trials=50, non_members=50),
                               seed=0, overlap_records=agnews_sample.head(100))
    assert result.auc > 0.9 and result.auc_ci[0] > 0.55
    assert result.tpr_at_1pct_fpr > 0.5 and result.epsilon_lower_bound > 1.0
    assert not result.passed
    assert result.reasons[0].startswith("membership inference: an attack distinguishes members from non-members")
    assert any(r.startswith("verbatim overlap") for r in result.reasons)


# --------------------------------------------------------------------------- every attack, a toy LM with a planted leak


def _records(n: int, labels: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"r{i}" for i in range(n)], "text": [f"record number {i} says {i * 7 % 13} and {i % 17} more words"
                                                                      for i in range(n)],
                         "label": [labels[i % len(labels)] for i in range(n)]})


def _fake_scorer(leaky: bool):
    """A toy LM's scores: a record's difficulty (from its text), plus, when `leaky`, a large gain when
    the record IS a demonstration of the prompt (the copy a real LM makes)."""

    def prompt_scores(lm, spec, demos, texts, labels, batch_size=16, past=None, should_stop=None):
        base = np.array([zlib.crc32(t.encode()) % 1000 / 100.0 for t in texts])  # in [0, 10)
        prompt_noise = zlib.crc32(repr(demos).encode()) % 100 / 1000.0
        jitter = np.array([zlib.crc32((repr(demos) + t).encode()) % 100 / 200.0 for t in texts])
        copied = np.array([leaky and any(t == d[0] for d in demos) for t in texts], dtype=float)
        text = -30 + base + jitter + prompt_noise + 12 * copied
        label = np.log(np.clip(0.2 + 0.05 * base + 0.2 * copied, 0.01, 0.99))
        return PromptScores(label, label - np.log1p(-np.exp(label)), text)

    return prompt_scores


@pytest.mark.parametrize("leaky", [True, False])
def test_non_private_audit_attacks_on_a_toy_lm(tiny_lm, agnews, monkeypatch, leaky):
    from dpcore.audit.config import AuditConfig
    from dpcore.audit.procedures import non_private_audit

    monkeypatch.setattr(mia_attacks, "prompt_scores", _fake_scorer(leaky))
    records = _records(6000, agnews.spec.label_names)
    result = non_private_audit(tiny_lm, agnews.spec, records, AuditConfig(trials=100, non_members=50,
                                                                                reference_prompts=4), seed=1,
                               overlap_records=records.head(50))
    by_name = {a.attack: a for a in result.attacks}
    assert list(by_name) == list(ATTACKS)
    if leaky:
        for name in ("text-calibrated", "label-calibrated", "lira-text", "lira-label"):
            assert by_name[name].auc > 0.97 and by_name[name].tpr_at_1pct_fpr > 0.5, name
        assert result.auc > 0.97 and result.attack != "duan"
        assert any(r.startswith("membership inference:") for r in result.reasons)
    else:
        for attack in result.attacks:
            assert abs(attack.auc - 0.5) < 0.1, attack.attack
            assert 0.0 <= attack.auc_ci[0] <= attack.auc_ci[1] <= 1.0


def test_demos_audit_on_run_demos(tiny_lm, agnews, monkeypatch):
    """The run's own demos: members = the private split, non-members = held-out records. Synthetic demos
    that copy no record pass (the toy LM leaks only a verbatim copy); a copied record is caught."""
    from dpcore.audit.config import AuditConfig
    from dpcore.audit.procedures import demos_audit

    monkeypatch.setattr(mia_attacks, "prompt_scores", _fake_scorer(True))
    labels = agnews.spec.label_names
    # 10 disjoint trials of 30 per side and label fill 1,200 members and 1,200 held-out records (and 3 OUT
    # prompts per label): the verbatim checks tokenize a label's members, so no more
    records = _records(2600, labels)
    members, held_out = records.iloc[:1300].reset_index(drop=True), records.iloc[1300:].reset_index(drop=True)
    config = AuditConfig(trials=10, members=30, non_members=30, reference_prompts=3)
    demos = [(f"a synthetic {label} demonstration", label) for label in labels]
    cache: dict = {}
    result = demos_audit(tiny_lm, agnews.spec, demos, members, held_out, config, seed=0, epsilon=8.0,
                         noise_multiplier=0.7, delta=1e-4, crosscheck_agreed=True, cache=cache)
    assert result.passed, result.reasons
    assert result.demo_sets == 4 and result.trials == 40 and result.setting == "dp"
    scores = result.mia_scores
    assert set(scores.loc[scores["member"], "record_id"]) <= set(members["id"])
    assert set(scores.loc[~scores["member"], "record_id"]) <= set(held_out["id"])
    cached = len(cache)
    tokenized = []
    real_tokenize = procedures.model_tokenize

    def counting_tokenize(lm):
        tokenize = real_tokenize(lm)
        return lambda texts: tokenized.append(len(texts)) or tokenize(texts)

    monkeypatch.setattr(procedures, "model_tokenize", counting_tokenize)
    again = demos_audit(tiny_lm, agnews.spec, demos, members, held_out, config, seed=0, epsilon=1.0,
                        noise_multiplier=2.0, delta=1e-4, crosscheck_agreed=True, cache=cache)
    assert len(cache) == cached  # same candidates at another epsilon: no new reference pass
    assert tokenized == [1] * len(labels)  # ... and the members' tokens for the overlap check are reused
    assert again.passed
    # a "DP" demo that is a member record verbatim fails the verbatim check
    copied = members.groupby("label").head(1)
    leaky = demos_audit(tiny_lm, agnews.spec, list(zip(copied["text"], copied["label"], strict=True)), members,
                        held_out, config, seed=0, epsilon=8.0, noise_multiplier=0.7, delta=1e-4,
                        crosscheck_agreed=True)
    assert not leaky.passed and any(r.startswith("verbatim overlap") for r in leaky.reasons)


def test_reference_scores_are_reused_across_epsilons_and_unchanged(tiny_lm, agnews, one_thread, monkeypatch):
    """Two epsilons' DP audits on the same trials (the pipeline's one trial seed) share the reference cache: the
    second scores its candidates under its own prompts only, and every score equals the unshared audit's."""
    from dpcore.audit import procedures as mia
    from dpcore.audit.config import AuditConfig
    from dpcore.fewshot.config import GenerationConfig

    records = agnews.train.sample(n=600, random_state=1).reset_index(drop=True)
    members, non_members = mia.split_members(records, seed=0)
    config = AuditConfig(trials=2, demo_sets=3, members=4, non_members=4)  # default: no OUT prompts
    gen = GenerationConfig(num_subsets=2, subset_size=1, max_tokens=3, top_k=20)
    scored = []
    original = mia_attacks.prompt_scores

    def counting(lm, spec, demos, texts, labels, **kwargs):
        scored.append((len(demos), len(texts)))
        return original(lm, spec, demos, texts, labels, **kwargs)

    monkeypatch.setattr(mia_attacks, "prompt_scores", counting)

    def audit(epsilon, cache):
        return mia.dp_audit(tiny_lm, agnews.spec, members, non_members, config, gen, 1.0, seed=5, epsilon=epsilon,
                            delta=1e-4, crosscheck_agreed=True, noise_seed=int(epsilon), cache=cache)

    cache: dict = {}
    first = audit(1.0, cache)
    per_record = sum(n for _, n in scored)
    records_scored = first.mia_scores.drop_duplicates(["demo_set", "record_id"]).shape[0]
    assert per_record == 2 * records_scored  # the prompt under audit + the no-demonstration reference
    scored.clear()
    second = audit(4.0, cache)
    assert all(shots == 1 for shots, _ in scored)  # no reference pass: every one came from the cache
    assert sum(n for _, n in scored) == records_scored
    scored.clear()
    alone = audit(4.0, None)
    assert sum(n for _, n in scored) == 2 * records_scored
    assert list(second.mia_scores["record_id"]) == list(alone.mia_scores["record_id"])
    np.testing.assert_allclose(second.mia_scores["score"], alone.mia_scores["score"], atol=1e-4)
    assert list(first.mia_scores["record_id"]) == list(second.mia_scores["record_id"])  # the same trials


def test_default_audit_plan_is_the_calibrated_attacks():
    """Without --audit-reference-prompts the run's audit plans and runs the three calibrated attacks (2 passes per
    record, fewer records than five attacks need), and says so before it runs; LiRA when asked."""
    from dpcore.config import RunConfig
    from tasks.audit import design_line, run_audit_design

    counts = {"Negative": 29000, "Positive": 36500}
    config = RunConfig(dataset="sst2", epsilons=[4], audit_mode="regenerate")
    audit_config, chosen, note = run_audit_design(config, counts, 884)
    assert audit_config.reference_prompts == 0 and chosen.attacks == 3 and note is None and chosen.conclusive
    line = design_line(audit_config, chosen, 3)
    assert line.startswith("audit: 3 attacks (duan, label-calibrated, text-calibrated) on 3 demo sets x ")
    assert f"{chosen.scored_records} records x 2 forward passes" in line and "--audit-reference-prompts" in line
    lira_config, lira, _ = run_audit_design(config.model_copy(update={"audit_reference_prompts": 4}), counts, 884)
    assert lira_config.reference_prompts == 4 and lira.attacks == 5
    assert lira.scored_records > chosen.scored_records  # Bonferroni over 5 attacks: more records, each 6 passes
    assert "x 6 forward passes" in design_line(lira_config, lira, 3)


def test_the_overlap_check_reuses_a_pool_only_for_the_same_records(tiny_lm):
    """`demo_overlap`'s shared token pools are keyed by the records themselves: a second call on other records
    of the same label tokenizes and checks those, never the first call's pool."""
    from dpcore.audit.overlap import model_tokenize

    demo = "the central bank raised its interest rate outlook for the coming quarter sharply"
    clean = pd.DataFrame({"id": ["a", "b"], "label": ["Business"] * 2,
                          "text": ["markets were calm on a quiet day", "a new phone was announced"]})
    leaky = pd.DataFrame({"id": ["a", "c"], "label": ["Business"] * 2,
                          "text": ["markets were calm on a quiet day", f"reports say {demo} today"]})
    pools: dict = {}
    tokenize = model_tokenize(tiny_lm)
    assert procedures.demo_overlap(tokenize, [demo], ["Business"], clean, 8, pools)[1] == 0
    longest, overlapping = procedures.demo_overlap(tokenize, [demo], ["Business"], leaky, 8, pools)
    assert overlapping == 1 and longest >= 8 and len(pools) == 2
    assert procedures.demo_overlap(tokenize, [demo], ["Business"], leaky, 8, pools) == (longest, 1)
    assert len(pools) == 2  # the same records again: their pool is reused
