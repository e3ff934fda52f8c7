"""Membership-inference attack scores (dpcore.audit.attacks): the statistics and the model pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpcore.audit import attacks as mia_attacks
from dpcore.audit.attacks import (
    ATTACKS,
    PromptScores,
    attack_scores,
    calibrated_score,
    lira_offline,
)
from dpcore.audit.statistics import roc_auc
from dpcore.errors import ConfigError

# --------------------------------------------------------------------------- pure statistics


def test_lira_offline_hand_example():
    target = [3.0, 0.0, 5.0]
    out = [[1.0, 2.0, 3.0],  # mean 2, sample sd 1
           [0.0, 0.0, 0.0],  # mean 0, sd 0
           [4.0, 6.0, 5.0]]  # mean 5, sd 1
    # per-record variance: z = (3 - 2) / 1 = 1; sd 0 is floored (no division by zero); (5 - 5) / 1 = 0
    z = lira_offline(target, out, per_example_variance=True)
    assert z[0] == pytest.approx(1.0) and z[1] == 0.0 and z[2] == pytest.approx(0.0)
    # global variance: pooled sd = sqrt(mean(1, 0, 1)) = sqrt(2/3)
    z = lira_offline(target, out, per_example_variance=False)
    assert z == pytest.approx([1 / math.sqrt(2 / 3), 0.0, 0.0])
    # default: global variance below 16 OUT prompts, per record from 16 on
    assert np.allclose(lira_offline(target, out), lira_offline(target, out, per_example_variance=False))
    rng = np.random.default_rng(0)
    many = rng.normal(size=(3, 16))
    assert np.allclose(lira_offline(target, many), lira_offline(target, many, per_example_variance=True))
    with pytest.raises(ConfigError, match="at least 2"):
        lira_offline([1.0], [[0.5]])
    with pytest.raises(ConfigError, match=r"\[n, R\]"):
        lira_offline([1.0, 2.0], [[0.5, 0.6]])


def test_calibrated_score_is_a_difference():
    assert calibrated_score([-1.0, -5.0], [-3.0, -4.0]).tolist() == [2.0, -1.0]
    with pytest.raises(ConfigError):
        calibrated_score([1.0], [1.0, 2.0])


def _scores(label_lp, text_lp) -> PromptScores:
    label_lp = np.asarray(label_lp, dtype=float)
    return PromptScores(label_lp, label_lp - np.log1p(-np.exp(label_lp)), np.asarray(text_lp, dtype=float))


def test_attack_scores_planted_and_prompt_independent():
    """Planted membership: the prompt raises members' scores -> every attack separates (AUC ~ 1).
    A prompt-independent model: every attack's AUC ~ 0.5."""
    rng = np.random.default_rng(0)
    n, refs = 400, 4
    member = np.arange(n) < n // 2
    difficulty = rng.normal(0, 3, n)  # records differ a lot in how likely they are anyway
    label_base = np.log(1 / (1 + np.exp(-rng.normal(0, 1, n))))

    def under(shift):
        text = difficulty + rng.normal(0, 0.3, n) + shift
        label = np.minimum(label_base + rng.normal(0, 0.05, n) + 0.1 * shift, -1e-3)
        return _scores(label, text)

    reference = under(0.0)
    out = PromptScores.stack([under(0.0) for _ in range(refs)])
    planted = attack_scores(under(np.where(member, 3.0, 0.0)), reference, out)
    assert list(planted) == list(ATTACKS)
    for name, values in planted.items():
        auc = roc_auc(values[member], values[~member])
        assert auc > (0.6 if name == "duan" else 0.97), name  # uncalibrated Duan: the record's difficulty blurs it
    independent = attack_scores(under(0.0), reference, out)
    for name, values in independent.items():
        assert abs(roc_auc(values[member], values[~member]) - 0.5) < 0.1, name
    assert set(attack_scores(under(0.0), reference, None)) == {"duan", "label-calibrated", "text-calibrated"}


# --------------------------------------------------------------------------- the model pass (tiny model)


def _naive_text_logprob(lm, spec, demos, text):
    prompt, start, end = mia_attacks._text_span(spec, demos, text)
    ids, lo, hi = mia_attacks._encode_with_span(lm, prompt, start, end)
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.as_tensor([ids]), use_cache=False).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[t - 1, ids[t]] for t in range(lo, hi)))


@pytest.mark.parametrize("task", ["agnews", "sst2"])
def test_prompt_scores_match_full_forwards(tiny_lm, task):
    from dpcore.data.taskspec import load_task_spec
    from dpcore.lm.icl import label_logprobs, normalise_probs

    spec = load_task_spec(task)
    texts = ["Stocks rallied on Monday after the central bank held rates.", "A gripping, funny film",
             "Team wins the cup", "x"]
    labels = [spec.label_names[i % len(spec.label_names)] for i in range(len(texts))]
    for demos in ([], [("An earlier record as the demonstration.", spec.label_names[0])]):
        scores = mia_attacks.prompt_scores(tiny_lm, spec, demos, texts, labels, batch_size=3)
        probs = normalise_probs(label_logprobs(tiny_lm, spec, demos, texts))
        duan = probs[np.arange(len(texts)), [spec.label_names.index(y) for y in labels]]
        assert np.allclose(np.exp(scores.label_logprob), duan, atol=1e-5)
        p = np.exp(scores.label_logprob)
        assert np.allclose(scores.label_logit, np.log(p) - np.log1p(-p), atol=1e-5)
        expected = [_naive_text_logprob(tiny_lm, spec, demos, t) for t in texts]
        assert np.allclose(scores.text_logprob, expected, atol=1e-3)
        assert np.all(scores.text_logprob < 0)


def test_span_covers_exactly_the_record(tiny_lm):
    from dpcore.data.taskspec import load_task_spec

    spec = load_task_spec("agnews")
    prompt, start, end = mia_attacks._text_span(spec, [("demo text", "World")], "the record itself")
    assert prompt[start:end] == "the record itself"
    ids, lo, hi = mia_attacks._encode_with_span(tiny_lm, prompt, start, end)
    assert tiny_lm.decode(ids[lo:hi]).strip() == "the record itself"


def test_reference_cache_and_truncation(tiny_lm, monkeypatch):
    from dpcore.data.taskspec import load_task_spec

    spec = load_task_spec("agnews")
    calls = []
    original = mia_attacks.prompt_scores

    def counting(lm, spec_, demos, texts, labels, batch_size=16, should_stop=None):
        calls.append(len(texts))
        return original(lm, spec_, demos, texts, labels, batch_size=batch_size, should_stop=should_stop)

    monkeypatch.setattr(mia_attacks, "prompt_scores", counting)
    out_demos = [("first out record", "World"), ("second out record", "Sports")]
    cache: dict = {}
    first = mia_attacks.reference_scores(tiny_lm, spec, ["a", "b"], ["World", "World"], out_demos, cache=cache)
    assert calls == [2, 2, 2] and first.out.text_logprob.shape == (2, 2)
    again = mia_attacks.reference_scores(tiny_lm, spec, ["b", "c"], ["World", "World"], out_demos, cache=cache)
    assert calls == [2, 2, 2, 1, 1, 1]  # only the new record is scored
    assert again.zero.text_logprob[0] == first.zero.text_logprob[1]
    assert mia_attacks.reference_scores(tiny_lm, spec, ["a"], ["World"], out_demos[:1]).out is None
    long = "one two three four five six seven eight nine ten eleven twelve"
    short = mia_attacks.truncate_texts(tiny_lm, [long, "brief"], 4)
    assert len(tiny_lm.encode(short[0])) <= 4 and long.startswith(short[0]) and short[1] == "brief"
    assert mia_attacks.truncate_texts(tiny_lm, [long], None) == [long]
