"""ICL evaluation: calibration math, multi-token label scoring, prefix-cache equivalence,
extraction rules, demo choice, output schemas, privacy of outputs, the CLI; and the suite's tests of the real
embedded model (its conversion, its predictions, a generated demo, AG News end to end), which share one load."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from dpcore.data.taskspec import load_task_spec
from dpcore.errors import ConfigError, DataValidationError
from dpcore.lm import icl
from dpcore.lm.config import EvalConfig
from dpcore.lm.model import LanguageModel
from dpcore.report.summary import summarise_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)

TREC_DEMOS = [
    ("What is the capital of France?", "Location"),
    ("Who wrote Hamlet?", "Person"),
    ("What does NASA stand for?", "Abbreviation"),
]
QUERIES = ["How many legs does a spider have?", "Why is the sky blue?", "x",
           "A much longer question about many things that go on and on and on, doesn't it?", "N/A", "", "[MASK]"]


@pytest.fixture(scope="module")
def trec_spec():
    return load_task_spec("trec")


def _manual_label_logprob(lm, context: list[int], label_tokens: list[int]) -> float:
    """log p(label tokens | context) one token at a time with the LM's own next-token API."""
    total = 0.0
    for k, token in enumerate(label_tokens):
        logits = lm.next_token_logits([context + label_tokens[:k]])[0]
        total += float(torch.log_softmax(logits.double(), dim=-1)[token])
    return total


# --------------------------------------------------------------------------- calibration


def test_calibrate_probs_matches_hand_computed_example():
    probs = np.array([[0.6, 0.4], [0.3, 0.7]])
    content_free = np.array([[0.8, 0.2], [0.6, 0.4]])  # averaged: p_cf = [0.7, 0.3]
    calibrated = icl.calibrate_probs(probs, content_free)
    # row 0: [0.6/0.7, 0.4/0.3] = [0.857143, 1.333333] -> / 2.190476
    np.testing.assert_allclose(calibrated[0], [0.391304, 0.608696], atol=1e-6)
    # row 1: [0.3/0.7, 0.7/0.3] = [0.428571, 2.333333] -> / 2.761905
    np.testing.assert_allclose(calibrated[1], [0.155172, 0.844828], atol=1e-6)
    assert probs[0].argmax() == 0 and calibrated[0].argmax() == 1  # calibration flips the biased row
    np.testing.assert_allclose(icl.calibrate_probs(probs, content_free.mean(axis=0)), calibrated)
    with pytest.raises(ConfigError):
        icl.calibrate_probs(probs, np.array([0.2, 0.3, 0.5]))


def test_normalise_probs_is_softmax_over_labels():
    logprobs = np.array([[math.log(0.2), math.log(0.2)], [-1000.0, -1001.0]])
    probs = icl.normalise_probs(logprobs)
    np.testing.assert_allclose(probs[0], [0.5, 0.5])
    np.testing.assert_allclose(probs[1], [1 / (1 + math.exp(-1)), 1 - 1 / (1 + math.exp(-1))])


# --------------------------------------------------------------------------- scoring


def test_multi_token_label_scored_as_sum_of_token_logprobs(tiny_lm, trec_spec):
    label_tokens = tiny_lm.encode(" " + trec_spec.verbalizer("Abbreviation"))
    assert len(label_tokens) > 1  # the point of this test
    queries = QUERIES[:2]
    scores = icl.label_logprobs(tiny_lm, trec_spec, TREC_DEMOS, queries)
    j = trec_spec.label_names.index("Abbreviation")
    for i, query in enumerate(queries):
        context = tiny_lm.encode(icl.prompt_text(trec_spec, TREC_DEMOS, query))
        assert scores[i, j] == pytest.approx(_manual_label_logprob(tiny_lm, context, label_tokens), abs=1e-4)
        first_only = _manual_label_logprob(tiny_lm, context, label_tokens[:1])
        assert scores[i, j] < first_only - 1e-3  # later tokens add (negative) log-probability


@pytest.mark.parametrize("demos", [TREC_DEMOS, []], ids=["with-demos", "zero-shot"])
def test_prefix_cache_scoring_equals_full_forward(peaked_lm, trec_spec, demos):
    spec = trec_spec.model_copy(update={"labels": {  # verbalizers of 1, 2-3 and 3+ tokens
        "Abbreviation": "Abbreviation", "Location": "Location", "Entity": "Science and Technology news",
        "Number": "Number", "Person": "Person", "Description": "Description"}})
    lengths = {len(peaked_lm.encode(" " + v)) for v in spec.labels.values()}
    assert len(lengths) >= 3
    cached = icl.label_logprobs(peaked_lm, spec, demos, QUERIES, batch_size=3)
    naive = icl.label_logprobs_naive(peaked_lm, spec, demos, QUERIES)
    assert cached.shape == (len(QUERIES), 6)
    np.testing.assert_allclose(cached, naive, atol=1e-4, rtol=0)
    assert np.ptp(cached[:, 0]) > 1e-3  # the scores depend on the query


def test_prefix_cache_counts_forward_tokens(tiny_lm, trec_spec):
    before = tiny_lm.stats.tokens
    icl.label_logprobs(tiny_lm, trec_spec, TREC_DEMOS, QUERIES[:3])
    cached_tokens = tiny_lm.stats.tokens - before
    before = tiny_lm.stats.tokens
    icl.label_logprobs_naive(tiny_lm, trec_spec, TREC_DEMOS, QUERIES[:3])
    naive_tokens = tiny_lm.stats.tokens - before
    prefix = len(tiny_lm.encode(icl.prefix_text(trec_spec, TREC_DEMOS)))
    assert naive_tokens > 3 * 6 * prefix  # every item and label re-reads the prefix
    assert cached_tokens < prefix + 3 * 40  # prefix once, then short suffixes


# --------------------------------------------------------------------------- extraction


def test_exact_match_rules():
    assert icl.normalise_answer("  Christopher Nolan. ") == "christopher nolan"
    assert icl.exact_match("christopher  nolan", "Christopher Nolan!")
    assert icl.exact_match("Sci-Fi", "scifi")
    assert icl.exact_match("“comedy”", "comedy")  # Unicode punctuation is stripped too
    assert icl.exact_match("\tcomedy\n", "comedy")
    assert not icl.exact_match("comedies", "comedy")
    assert not icl.exact_match("romantic comedy", "comedy")
    assert icl.normalise_answer("") == ""


def test_answer_is_cut_at_newline(tiny_lm):
    tokens = tiny_lm.encode(" animated\nSentence: something else")
    assert icl._cut_answer(tiny_lm, tokens) == ("animated", True)
    assert icl._cut_answer(tiny_lm, tiny_lm.encode(" animated")) == ("animated", False)


@torch.inference_mode()
def _naive_greedy_answers(lm, spec, demos, queries, max_new_tokens: int) -> list[str]:
    """Reference greedy decoding: a full forward per item and token, no prefix cache."""
    answers = []
    for query in queries:
        ids = lm.encode(icl.prompt_text(spec, demos, query))
        generated: list[int] = []
        for _ in range(max_new_tokens):
            token = int(lm.next_token_logits([ids + generated])[0].argmax())
            if token in lm.eos_token_ids:
                break
            generated.append(token)
            if icl._cut_answer(lm, generated)[1]:
                break
        answers.append(icl._cut_answer(lm, generated)[0])
    return answers


def test_cached_greedy_extraction_equals_naive(peaked_lm, movies_genre):
    spec = movies_genre.spec
    demos = [("a funny movie with jim carrey", "comedy"), ("a scary film about ghosts", "horror")]
    queries = movies_genre.test["text"].tolist()[:5] + [""]
    cached = icl.extract_answers(peaked_lm, spec, demos, queries, max_new_tokens=6, batch_size=4)
    naive = _naive_greedy_answers(peaked_lm, spec, demos, queries, max_new_tokens=6)
    assert cached == naive
    assert len(set(cached)) > 1 and all("\n" not in a for a in cached)


# --------------------------------------------------------------------------- demo choice


POOL = [(f"text {label} {i}", label, f"id-{label}-{i}") for label in ("A", "B", "C", "D") for i in range(3)]


def test_choose_demos_one_per_label_and_deterministic():
    labels = ["A", "B", "C", "D"]
    first = icl.choose_demos(POOL, labels, 4, seed=3)
    assert first == icl.choose_demos(POOL, labels, 4, seed=3)
    assert sorted(d[1] for d in first) == labels  # one per label
    assert all(len(d) == 3 for d in first)  # ids pass through
    orders = {tuple(d[2] for d in icl.choose_demos(POOL, labels, 4, seed=s)) for s in range(6)}
    assert len(orders) > 1  # seeds change the choice/order
    two = icl.choose_demos(POOL, labels, 2, seed=0)
    assert len({d[1] for d in two}) == 2  # labels without replacement
    six = icl.choose_demos(POOL, labels, 6, seed=0)
    counts = pd.Series([d[1] for d in six]).value_counts()
    assert sorted(counts.tolist()) == [1, 1, 2, 2] and len({d[2] for d in six}) == 6
    assert icl.choose_demos(POOL, labels, 0, seed=0) == []
    only_a = [d for d in POOL if d[1] == "A"]
    assert {d[1] for d in icl.choose_demos(only_a, labels, 2, seed=0)} == {"A"}  # labels without demos skipped
    with pytest.raises(ConfigError):
        icl.choose_demos([("t", "Z")], labels, 2, seed=0)


def test_demo_items_and_their_ids():
    item = icl.DemoItem.of(("a text", "A"))
    assert item == icl.DemoItem("a text", "A", None) and (item.text, item.label) == ("a text", "A")
    assert icl.DemoItem.of(("t", 3, 7)) == icl.DemoItem("t", "3", "7")
    assert icl.DemoItem.of(item) is item
    with pytest.raises(DataValidationError):
        icl.DemoItem.of(("only text",))
    # record ids (never text) or the position in the prompt
    assert icl.demo_ids([("secret text", "A", "r9"), ("other text", "B")]) == ["r9", "demo-1"]


def test_select_test_is_a_deterministic_seeded_prefix(agnews):
    first = icl.select_test(agnews.test, 10)
    assert first["id"].tolist() == icl.select_test(agnews.test, 10)["id"].tolist()
    assert first["id"].tolist() == icl.select_test(agnews.test, 20)["id"].tolist()[:10]
    assert first["id"].tolist() != agnews.test["id"].tolist()[:10]
    assert len(icl.select_test(agnews.test, None)) == len(agnews.test)


# --------------------------------------------------------------------------- evaluate


def _synthetic_pool():
    return [("Stocks fell as oil prices rose.", "Business"), ("The team won the cup final.", "Sports"),
            ("New chip doubles battery life.", "Technology"), ("Leaders met for peace talks.", "World")]


def test_evaluate_classification_schema(tiny_lm, agnews):
    config = EvalConfig(shots=4, seeds=2, test_size=6)
    predictions, metrics = icl.evaluate(tiny_lm, agnews.spec, agnews.test, _synthetic_pool(), "sigma-zero",
                                        math.inf, config)
    assert list(predictions.columns) == icl.PREDICTION_COLUMNS
    assert list(metrics.columns) == icl.METRIC_COLUMNS
    assert len(predictions) == 12 and len(metrics) == 2
    assert predictions["epsilon"].dtype == float and np.isinf(predictions["epsilon"]).all()
    assert np.isinf(metrics["epsilon"]).all() and metrics["n"].tolist() == [6, 6]
    labels = agnews.spec.label_names
    for row in predictions.itertuples(index=False):
        assert len(row.label_probs) == 4 and sum(row.label_probs) == pytest.approx(1.0)
        assert row.pred_raw == labels[int(np.argmax(row.label_probs))]
        assert row.pred_calibrated == labels[int(np.argmax(row.calibrated_probs))]
        assert row.correct_raw == (row.pred_raw == row.gold)
        assert len(row.demo_ids) == 4
    for m in metrics.itertuples(index=False):
        rows = predictions[predictions["seed"] == m.seed]
        assert m.accuracy == pytest.approx(rows["correct_raw"].mean())
        assert m.calibrated_accuracy == pytest.approx(rows["correct_calibrated"].mean())
    assert metrics["calibrated"].all() and (metrics["shots"] == 4).all()
    summary = summarise_metrics(metrics)
    assert summary.loc[0, "seeds"] == 2 and summary.loc[0, "accuracy_mean"] == pytest.approx(metrics["accuracy"].mean())
    assert summary.loc[0, "accuracy_std"] == pytest.approx(np.std(metrics["accuracy"]))


def test_evaluate_zero_shot_is_scored_once_and_without_calibration(tiny_lm, agnews):
    predictions, metrics = icl.evaluate(tiny_lm, agnews.spec, agnews.test, None, "zero-shot", 0.0,
                                        EvalConfig(shots=4, seeds=3, test_size=4, calibrate=False))
    assert metrics["reused"].tolist() == [False, True, True] and (metrics["shots"] == 0).all()
    assert metrics["accuracy"].nunique() == 1 and not metrics["calibrated"].any()
    assert (predictions["pred_raw"] == predictions["pred_calibrated"]).all()
    assert icl.seconds_per_100_items(metrics) >= 0  # whole seconds (public): a tiny model scores 4 items in < 1 s


def test_evaluate_extraction_uses_exact_match(tiny_lm, movies_genre):
    pool = movies_genre.train[["text", "label"]].head(6).itertuples(index=False, name=None)
    predictions, metrics = icl.evaluate(tiny_lm, movies_genre.spec, movies_genre.test, list(pool), "tang", 4.0,
                                        EvalConfig(shots=2, seeds=2, test_size=3), max_new_tokens=3)
    assert len(predictions) == 6 and (predictions["label_probs"].map(len) == 0).all()
    assert (metrics["accuracy"] == metrics["calibrated_accuracy"]).all() and not metrics["calibrated"].any()
    expected = [icl.exact_match(p, g) for p, g in zip(predictions["pred_raw"], predictions["gold"], strict=True)]
    assert predictions["correct_raw"].tolist() == expected


def test_random_real_outputs_hold_no_record_text(tiny_lm, agnews):
    real = agnews.train.head(40)
    pool = list(zip(real["text"], real["label"], real["id"], strict=True))
    predictions, metrics = icl.evaluate(tiny_lm, agnews.spec, agnews.test, pool, "random-real", math.inf,
                                        EvalConfig(shots=4, seeds=2, test_size=3))
    texts = set(real["text"])
    for frame in (predictions, metrics):
        for column in frame.columns:
            for value in frame[column]:
                values = value if isinstance(value, list | np.ndarray) else [value]
                assert not any(isinstance(v, str) and v in texts for v in values), column
    assert set(predictions["demo_ids"].iloc[0]) <= set(real["id"])
    public, private = icl.split_private_demo_ids(predictions)
    assert (public["demo_ids"].map(len) == 0).all() and (public["pred_raw"] == predictions["pred_raw"]).all()
    assert len(private) == 2 and set(private.columns) == {"method", "epsilon", "seed", "demo_ids"}
    public, _ = icl.split_private_demo_ids(predictions, free_text=True)  # extraction: answers may quote demos
    assert (public["pred_raw"] == "").all() and (public["correct_raw"] == predictions["correct_raw"]).all()


def test_evaluate_rejects_bad_input(tiny_lm, agnews):
    config = EvalConfig(shots=4, seeds=1, test_size=2)
    with pytest.raises(ConfigError, match="method"):
        icl.evaluate(tiny_lm, agnews.spec, agnews.test, _synthetic_pool(), "magic", 1.0, config)
    with pytest.raises(ConfigError, match="demos"):
        icl.evaluate(tiny_lm, agnews.spec, agnews.test, [], "tang", 1.0, config)
    with pytest.raises(DataValidationError, match="Cooking"):
        icl.evaluate(tiny_lm, agnews.spec, agnews.test, [("t", "Cooking")], "tang", 1.0, config)


# --------------------------------------------------------------------------- CLI


def test_cli_random_real_json_and_private_ids(tiny_model_dir, tmp_path, cli, dpicl_home):
    out = tmp_path / "eval"
    code, stdout, _ = cli(["evaluate", "--dataset", "trec", "--baseline", "random-real", "--model",
                           str(tiny_model_dir), "--test-size", "4", "--seeds", "2", "--shots", "3", "--json",
                           "--out", str(out)])
    assert code == 0
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["n"] == 4 and result["method"] == "random-real" and result["epsilon"] == "inf"
    for key in ("accuracy", "calibrated_accuracy"):
        assert set(result[key]) == {"mean", "std", "per_seed"} and len(result[key]["per_seed"]) == 2
    assert not (out / "predictions.parquet").exists()  # per-item predictions are private
    assert "predictions.parquet" not in (out / "manifest.json").read_text()
    private = [p for p in (dpicl_home / "private").rglob("real_demos.parquet") if p.parent.name == out.name]
    assert private and len(pd.read_parquet(private[0]).loc[0, "demo_ids"]) == 3
    assert (private[0].parent / "predictions.parquet").exists() and result["private_out"] == str(private[0].parent)
    assert (out / "metrics.parquet").exists() and (out / "manifest.json").exists()


def test_cli_random_real_extraction_keeps_answers_private(tiny_model_dir, tmp_path, cli, dpicl_home):
    out = tmp_path / "eval"
    code, _, _ = cli(["evaluate", "--dataset", "movies-sample-genre", "--baseline", "random-real", "--model",
                      str(tiny_model_dir), "--test-size", "3", "--seeds", "1", "--shots", "2",
                      "--max-new-tokens", "2", "--out", str(out)])
    assert code == 0
    assert not (out / "predictions.parquet").exists()  # answers generated from real demos stay private
    private = [p for p in (dpicl_home / "private").rglob("predictions.parquet") if p.parent.name == out.name]
    assert private and len(pd.read_parquet(private[0])) == 3


def test_cli_demos_file_and_errors(tiny_model_dir, tmp_path, cli):
    demos = pd.DataFrame({"label": ["Location", "Person", "Number"], "text": ["Where is Rome?", "Who is he?",
                                                                             "How many?"],
                          "method": "sigma-zero", "noise_multiplier": 0.0})
    demos.to_parquet(tmp_path / "demos.parquet")
    code, stdout, _ = cli(["evaluate", "--dataset", "trec", "--demos", str(tmp_path / "demos.parquet"),
                           "--model", str(tiny_model_dir), "--test-size", "3", "--seeds", "1",
                           "--out", str(tmp_path / "o")])
    assert code == 0 and "sigma-zero (epsilon inf)" in stdout and "calibrated" in stdout
    code, _, err = cli(["evaluate", "--dataset", "trec", "--demos", str(tmp_path / "missing.parquet"),
                        "--model", str(tiny_model_dir)])
    assert code == 2 and "missing.parquet" in err
    with pytest.raises(SystemExit):
        cli(["evaluate", "--dataset", "trec"])  # --demos or --baseline is required


# --------------------------------------------------------------------------- real model
# Every test of the real embedded model is in this file: one worker loads it (`embedded_lm`, once per session);
# the logic its other callers check runs on the tiny model.


@pytest.mark.slow
def test_embedded_model_converted_once_and_cached(embedded_lm, dpicl_home):
    from dpcore.lm.models import resolve_model

    resolved = resolve_model("smollm2-135m")
    assert resolved.kind == "embedded"
    folder = dpicl_home / "models" / "smollm2-135m"
    assert (folder / "config.json").exists() and list(folder.glob("*.safetensors"))
    assert "quantization_config" not in (folder / "config.json").read_text()
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = LanguageModel.load("smollm2-135m")
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == written  # loaded, not converted again
    assert again.vocab_size == 49152 and 2 in again.eos_token_ids
    assert abs(again.num_parameters(include_embeddings=True) - 134.5e6) < 1e6


@pytest.mark.slow
def test_embedded_model_predicts_sensibly(embedded_lm):
    probs = embedded_lm.next_token_probs([embedded_lm.encode("The capital of France is")])
    assert embedded_lm.decode([int(probs[0].argmax())]).strip() == "Paris"


@pytest.mark.slow
def test_real_model_generates_agnews_demo(embedded_lm, agnews):
    """Algorithm 1 on the embedded model and real AG News records: left-padded batches give the one-at-a-time
    distributions on real weights, and a generated demo has readable text (the engine's logic: test_generation.py)."""
    from dpcore.fewshot.config import GenerationConfig
    from dpcore.fewshot.generation import generate_demos
    from dpcore.lm.batching import BatchedForward

    spec = agnews.spec
    label_records = {"Sports": agnews.records_for("Sports")}
    prompts = [embedded_lm.encode(spec.generation.build("Sports", label_records["Sports"][i:i + k]))
               for i, k in ((0, 0), (3, 1))]  # two lengths: the shorter one left-padded
    single = torch.cat([embedded_lm.next_token_logits([p]) for p in prompts])
    batched = BatchedForward(embedded_lm)(prompts)
    assert torch.allclose(torch.softmax(batched, -1), torch.softmax(single, -1), atol=1e-5)
    config = GenerationConfig(num_subsets=2, subset_size=1, top_k=100, max_tokens=3)
    result = generate_demos(embedded_lm, spec, label_records, config, 0.0, seed=0)
    demo = result.demos[0]
    assert demo.tokens >= 1 and demo.text.strip()
    assert result.private_stats["forward_tokens_per_s"] > 0


@pytest.mark.slow
def test_real_model_agnews_20_items(embedded_lm, agnews):
    test = icl.select_test(agnews.test, 20)
    zero = icl.label_logprobs(embedded_lm, agnews.spec, [], test["text"].tolist())
    accuracy = np.mean([agnews.spec.label_names[k] == g for k, g in zip(zero.argmax(1), test["label"], strict=True)])
    assert accuracy >= 0.35  # 4 labels: chance is 0.25; the model reaches about 0.55 on AG News 0-shot
    # short demonstrations (a third of the first records' length): the naive path reads every label's whole prompt
    real = agnews.train[agnews.train["text"].str.len() <= 120].groupby("label").head(1)
    demos = icl.choose_demos(list(zip(real["text"], real["label"], strict=True)), agnews.spec.label_names, 4, 0)
    assert len(demos) == 4
    # the cached path on a batch of two queries; the naive one (every label's whole prompt) on the first
    cached = icl.label_logprobs(embedded_lm, agnews.spec, demos, test["text"].tolist()[:2])
    naive = icl.label_logprobs_naive(embedded_lm, agnews.spec, demos, test["text"].tolist()[:1])
    np.testing.assert_allclose(cached[:1], naive, atol=1e-3, rtol=0)


@pytest.mark.slow
def test_the_own_data_loop_closes_on_the_embedded_model(embedded_lm, tmp_path, cli):
    """README's own-data loop on the real model, with a separate test file, at `dpicl run`'s defaults but
    shorter demos and fewer test items: set-budget -> run (fresh noise, the audit of its own demos against rows
    of the private file held out for it, nothing more charged) -> release (its gate) -> predict."""
    import yaml

    from dpcore.data.datasets import load_dataset
    from tasks import common

    with common._MODELS_LOCK:  # the run's model cache reuses this worker's load
        common._MODELS[("smollm2-135m", "auto", "auto")] = embedded_lm
    # a user's file of the size the defaults are for (2,000 records): SST-2 records dpicl's other tests leave
    # alone (the split's last), under a user's columns. On a few hundred the sampling rate is high enough that
    # the DP demos' own leak, within epsilon 4, trips the audit's label-calibrated attack now and then
    sst2 = load_dataset(load_task_spec("sst2"))
    frame = pd.concat([sst2.train[sst2.train["label"] == y].tail(1000) for y in sst2.labels])
    frame = frame.rename(columns={"id": "review_id", "text": "review", "label": "sentiment"})
    frame[["review_id", "review", "sentiment"]].to_csv(tmp_path / "reviews.csv", index=False)
    test = sst2.test.head(20).rename(columns={"id": "review_id", "text": "review", "label": "sentiment"})
    test[["review_id", "review", "sentiment"]].to_csv(tmp_path / "reviews_test.csv", index=False)
    spec = {"name": "loop-reviews", "kind": "classification",
            "source": {"type": "file", "path": "reviews.csv", "text_column": "review", "label_column": "sentiment",
                       "id_column": "review_id"},
            "split": {"test_size": 0.2, "seed": 0}, "labels": {y: y for y in sst2.labels},
            "generation": {"instruction": "Given a sentiment label, write a movie review with that sentiment.",
                           "label_prefix": "Sentiment: ", "text_prefix": "Review:", "stop": "\n"},
            "icl": {"input_prefix": "Review:", "output_prefix": "Sentiment:"}}
    (tmp_path / "reviews.yaml").write_text(yaml.safe_dump(spec))
    data = ["--task-spec", str(tmp_path / "reviews.yaml"), "--data-path", str(tmp_path / "reviews.csv"),
            "--test-path", str(tmp_path / "reviews_test.csv")]
    assert cli(["ledger", "set-budget", "--dataset", "loop-reviews", "--epsilon", "8", "--delta", "1e-5"])[0] == 0
    # A sound release passes the gate with probability >= 0.95 (the audit's false-alarm bound): a second run
    # (charged too, within the budget) keeps this test's false failures under 0.25%.
    for attempt in range(2):
        code, out, err = cli(["run", *data, "--max-tokens", "4", "--test-size", "4", "--seeds", "1",
                              "--audit-max-record-tokens", "8", "--yes", "--json"])
        assert code == 0, err
        run = json.loads(out.strip().splitlines()[-1])
        assert run["epsilons"] == [4.0] and run["delta"] == 1e-5 and run["audit"]["ran"]
        assert "audit: 3 attacks" in err and "detects a leak of AUC 0.75 with power 0.9" in err
        assert "audit: its non-members are 10% of the private file held out" in err
        assert run["planned_cost"]["epsilon"] == pytest.approx(3.998, abs=1e-3)  # the audit charged nothing
        code, out, err = cli(["release", "--run", run["run_id"]])
        if code == 0 or "membership inference" not in err or attempt:
            break
    assert code == 0, err
    (tmp_path / "queries.jsonl").write_text('{"id": "q1", "text": "A warm, funny and moving film."}\n'
                                            '{"id": "q2", "text": "Dull, overlong and badly acted."}\n')
    code, _, err = cli(["predict", "--input", str(tmp_path / "queries.jsonl"), "--out", str(tmp_path / "a.jsonl"),
                        "--dataset-id", "loop-reviews"])
    assert code == 0, err
    answers = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [a["id"] for a in answers] == ["q1", "q2"] and {a["prediction"] for a in answers} <= set(sst2.labels)


def test_cli_dp_demos_from_generation_frame_get_an_accounted_epsilon(tiny_model_dir, tmp_path, cli):
    from dpcore.fewshot.generation import Demo, demos_frame

    demos = [Demo(label=label, shot=0, text=text, tokens=5, stop_reason="eos", noise_multiplier=0.5, num_subsets=4,
                  subset_size=1, top_k=100, rvp=True, max_tokens=10, mechanism="gaussian", model="tiny",
                  seeded_noise=True, method="tang")
             for label, text in [("Location", "Where is Rome?"), ("Person", "Who is he?"), ("Number", "How many?")]]
    demos_frame(demos).to_parquet(tmp_path / "demos.parquet")
    code, stdout, err = cli(["evaluate", "--dataset", "trec", "--demos", str(tmp_path / "demos.parquet"),
                             "--model", str(tiny_model_dir), "--test-size", "2", "--seeds", "1", "--json",
                             "--out", str(tmp_path / "o")])
    assert code == 0 and "accounted from the demos' noise multiplier" in err
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["method"] == "tang" and 0 < result["epsilon"] < 100
    code, stdout, _ = cli(["evaluate", "--dataset", "trec", "--demos", str(tmp_path / "demos.parquet"),
                           "--epsilon", "2", "--model", str(tiny_model_dir), "--test-size", "2", "--seeds", "1",
                           "--json", "--out", str(tmp_path / "o2")])
    assert code == 0 and json.loads(stdout.strip().splitlines()[-1])["epsilon"] == 2.0


def test_cli_instruction_only_baseline(tiny_model_dir, tmp_path, cli):
    code, stdout, _ = cli(["evaluate", "--dataset", "trec", "--baseline", "instruction-only", "--model",
                           str(tiny_model_dir), "--test-size", "2", "--seeds", "2", "--shots", "2", "--max-tokens",
                           "3", "--seed", "1", "--json", "--out", str(tmp_path / "o")])
    assert code == 0
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["method"] == "instruction-only" and result["epsilon"] == 0.0 and result["shots"] == 2


def test_a_test_size_beyond_the_split_is_an_error_not_a_cap():
    import pandas as pd

    from dpcore.errors import ConfigError
    from dpcore.lm.icl import select_test

    test = pd.DataFrame({"id": ["a", "b", "c"], "text": ["x", "y", "z"], "label": ["p", "q", "p"]})
    assert len(select_test(test, 3)) == 3 and len(select_test(test, None)) == 3
    with pytest.raises(ConfigError, match="--test-size 4: the test split has only 3 items"):
        select_test(test, 4)
