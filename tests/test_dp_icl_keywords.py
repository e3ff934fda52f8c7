"""DP-ICL on extraction tasks: keyword space aggregation over the query's own words (`dpcore.dp_icl.keywords`,
Wu et al. 2024, Section 3.3, adapted). The keyword space is the query's words only, a vote's change moves the
histogram by at most sqrt(2K) (and can reach it), the noise has the std the plan says, sigma 0 releases the
majority keywords in query order, the event charged is the classification path's, and the path runs end to end on
the tiny model, from `answer_queries` and from `dpicl dp-icl`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpcore.dp_icl import answer, ensemble, keywords, privacy, subsets
from dpcore.errors import ConfigError
from dpcore.lm.icl import normalise_answer
from dpcore.privacy import composition
from dpcore.privacy.ledger import Ledger

QUERY = "Who directed the thriller film by Mara Voss, about a lost robot?"
MARK = "zqxsecret"  # a private record's word that no query holds


def test_the_keyword_space_is_the_querys_distinct_words_in_order():
    assert keywords.keyword_space(QUERY) == ("who", "directed", "the", "thriller", "film", "by", "mara", "voss",
                                             "about", "a", "lost", "robot")
    assert keywords.keyword_space("the the The, the") == ("the",)
    space = keywords.keyword_space(QUERY)
    # a vote: its answer's words in the space, distinct, the first K in answer order
    assert keywords.answer_keywords("Voss, Mara (director) voss", space, 4) == ("voss", "mara")
    assert keywords.answer_keywords("mara voss lost robot film", space, 3) == ("mara", "voss", "lost")
    assert keywords.answer_keywords(f"{MARK} kerrigan", space, 4) == ()
    with pytest.raises(ConfigError):
        keywords.answer_keywords("mara", space, 0)


def test_a_private_word_not_in_the_query_is_never_released_even_without_noise():
    rng = np.random.default_rng(0)
    every = [f"{MARK} mara voss", f"{MARK}", f"{MARK} voss mara", f"{MARK} {MARK}2", f"mara voss {MARK}"]
    released = keywords.aggregate(every, QUERY, max_keywords=4, std=0.0, rng=rng)
    assert released == "mara voss" and MARK not in released
    assert keywords.aggregate([MARK] * 5, QUERY, max_keywords=4, std=0.0, rng=rng) == ""
    with pytest.raises(ValueError):  # a histogram is over the query's keywords only
        keywords.keyword_histogram([(MARK,)], keywords.keyword_space(QUERY))


def test_answers_end_to_end_are_made_of_the_query_words_even_when_every_subset_answers_a_private_word(
        monkeypatch, tiny_lm):
    """Every subset's 'model' answers its first demo's private label (a word no query holds) and the query's
    last two words; at sigma 0 only the query's words can come out."""
    from dpcore.data.taskspec import load_task_spec

    spec = load_task_spec("movies-sample-director")
    records = [(f"question {i} by someone", f"{MARK}{i} person", f"r{i}") for i in range(40)]
    queries = ["which film did mara voss direct", "who made the lost robot film"]

    def copying(lm, spec, demos, queries, max_new_tokens=12):
        return [" ".join([demos[0].label if demos else MARK, *q.split()[-2:]]) for q in queries]

    monkeypatch.setattr(ensemble, "extract_answers", copying)
    plan = privacy.dp_icl_plan(math.inf, 1e-4, 2, len(records), subsets=4, shots=2, aggregation="keywords",
                               max_keywords=4)
    assert plan.parameters["noise_std"] == 0.0
    got = answer.answer_queries(tiny_lm, spec, records, queries, plan, subsets.run_key(np.random.default_rng(1)),
                                np.random.default_rng(2))
    assert got.labels == ("voss direct", "robot film")


def _l2_change(before: list[tuple[str, ...]], after: list[tuple[str, ...]], space) -> float:
    return float(np.linalg.norm(keywords.keyword_histogram(before, space) - keywords.keyword_histogram(after, space)))


@pytest.mark.parametrize("k", [1, 2, 4, 5])
def test_one_changed_subset_moves_the_histogram_by_at_most_sqrt_2k_and_the_worst_case_reaches_it(k):
    space = keywords.keyword_space(QUERY)
    assert keywords.keyword_sensitivity(k) == pytest.approx(math.sqrt(2 * k))
    rng = np.random.default_rng(k)
    pool = [*space, MARK, f"{MARK}2", "kerrigan"]  # answers may hold words outside the space
    worst = 0.0
    for _ in range(1000):
        answers = [" ".join(rng.choice(pool, size=rng.integers(0, 8))) for _ in range(6)]
        changed = list(answers)
        changed[int(rng.integers(0, 6))] = " ".join(rng.choice(pool, size=rng.integers(0, 8)))
        before = [keywords.answer_keywords(a, space, k) for a in answers]
        after = [keywords.answer_keywords(a, space, k) for a in changed]
        worst = max(worst, _l2_change(before, after, space))
    assert worst <= keywords.keyword_sensitivity(k) + 1e-12
    # disjoint full votes: K counts down by one, K up by one
    votes = [keywords.answer_keywords(" ".join(space[:k]), space, k)] * 3
    moved = [keywords.answer_keywords(" ".join(space[k:2 * k]), space, k), *votes[1:]]
    assert _l2_change(votes, moved, space) == pytest.approx(keywords.keyword_sensitivity(k))


def test_the_noise_has_mean_zero_and_std_sigma_sqrt_2k():
    sigma, k, draws = 0.7, 3, 20_000
    std = keywords.noise_std(sigma, k)
    assert std == pytest.approx(sigma * math.sqrt(2 * k))
    counts = np.array([0.0, 2.0, 5.0, 1.0])
    rng = np.random.default_rng(20)
    noise = np.stack([keywords.noisy_counts(counts, std, rng) - counts for _ in range(draws // len(counts))]).ravel()
    assert noise.size == draws
    assert abs(noise.mean()) < 5 * std / math.sqrt(draws)
    assert abs(noise.std(ddof=1) - std) < 5 * std / math.sqrt(2 * (draws - 1))
    assert np.array_equal(keywords.noisy_counts(counts, 0.0, rng), counts)


def test_sigma_zero_releases_the_majority_keywords_in_query_order():
    rng = np.random.default_rng(0)
    answers = ["voss mara", "Mara Voss", "mara voss film", "the film", "robot"]  # M = 5: a majority is 3
    assert keywords.aggregate(answers, QUERY, max_keywords=4, std=0.0, rng=rng) == "mara voss"
    # exactly M / 2 is no majority
    assert keywords.aggregate(["mara voss", "mara voss", "film", "robot"], QUERY, max_keywords=4, std=0.0,
                              rng=rng) == ""
    assert keywords.aggregate(["film", "robot", "lost", ""], QUERY, max_keywords=4, std=0.0, rng=rng) == ""
    # K caps each vote: with K = 1 only each answer's first keyword counts
    assert keywords.aggregate(["robot film", "robot film", "film robot"], QUERY, max_keywords=1, std=0.0,
                              rng=rng) == "robot"
    assert keywords.threshold(5) == 2.5


@pytest.mark.parametrize("sigma, queries", [(0.8, 3), (1.5, 40)])
def test_an_extraction_plan_charges_the_classification_event(sigma, queries):
    records, delta = 200, 1e-5
    shape = dict(subsets=5, shots=2, noise_multiplier=sigma)
    rnm = privacy.dp_icl_plan(None, delta, queries, records, **shape)
    kw = privacy.dp_icl_plan(None, delta, queries, records, **shape, aggregation="keywords", max_keywords=3)
    assert kw.spends[0].event == rnm.spends[0].event
    one = privacy.dp_icl_event(sigma, 5 * 2 / records, 1)
    assert kw.spends[0].event == privacy.dp_icl_event(sigma, 5 * 2 / records, queries)
    assert composition.compose([kw.spends[0].event], delta).epsilon == \
        pytest.approx(composition.compose([rnm.spends[0].event], delta).epsilon)
    assert composition.compose([one], delta).epsilon <= kw.epsilon
    assert kw.epsilon == pytest.approx(rnm.epsilon)
    # only the std per count follows the sensitivity: sigma sqrt(2K) against sigma sqrt(2)
    assert (kw.parameters["aggregation"], kw.parameters["max_keywords"]) == ("keywords", 3)
    assert (rnm.parameters["aggregation"], rnm.parameters["max_keywords"]) == ("rnm", None)
    assert kw.parameters["noise_std"] == pytest.approx(sigma * math.sqrt(6))
    assert rnm.parameters["noise_std"] == pytest.approx(sigma * math.sqrt(2))
    # a calibrated plan: the same sigma for the same budget
    at_eps = [privacy.dp_icl_plan(2.0, delta, queries, records, subsets=5, shots=2, **extra)
              for extra in ({}, {"aggregation": "keywords", "max_keywords": 3})]
    assert at_eps[0].parameters["noise_multiplier"] == at_eps[1].parameters["noise_multiplier"]
    with pytest.raises(ConfigError):
        privacy.query_sensitivity("exponential")


def test_answer_queries_on_the_movies_sample_returns_one_string_of_query_words_per_query(peaked_lm, one_thread):
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    spec = load_task_spec("movies-sample-director")
    data = load_dataset(spec)
    records = list(zip(data.train["text"], data.train["label"], data.train["id"].astype(str), strict=True))
    queries = data.test["text"].astype(str).tolist()[:3]
    plan = privacy.dp_icl_plan(None, 1e-4, len(queries), len(records), subsets=4, shots=2, noise_multiplier=0.5,
                               aggregation="keywords", max_keywords=4)
    key = subsets.run_key(np.random.default_rng(5))
    got = answer.answer_queries(peaked_lm, spec, records, queries, plan, key, np.random.default_rng(6),
                                max_new_tokens=6)
    assert len(got.labels) == len(queries) and all(isinstance(a, str) for a in got.labels)
    for released, query in zip(got.labels, queries, strict=True):
        assert set(released.split()) <= set(keywords.keyword_space(query))
        assert released == normalise_answer(released)
    again = answer.answer_extraction(peaked_lm, spec, records, queries, plan, key, np.random.default_rng(6),
                                     max_new_tokens=6)
    assert again == got
    rnm = privacy.dp_icl_plan(None, 1e-4, len(queries), len(records), subsets=4, shots=2, noise_multiplier=0.5)
    with pytest.raises(ConfigError, match="extraction plan"):
        answer.answer_extraction(peaked_lm, spec, records, queries, rnm, key, np.random.default_rng(6))


def test_dpicl_dp_icl_on_an_extraction_task_charges_once_before_answering(cli, monkeypatch, one_thread):
    from tasks import dp_icl

    def entries(run_id: str | None = None) -> list:
        book = Ledger()
        rows = book.entries("movies-sample-director") if "movies-sample-director" in book.dataset_ids() else []
        return [e for e in rows if run_id is None or e.run_id == run_id]

    seen = []
    real = dp_icl.answer_queries

    def answering(*args, **kwargs):  # the ledger already holds the run's charge when the subsets answer
        seen.append(len(entries()))
        return real(*args, **kwargs)

    monkeypatch.setattr(dp_icl, "answer_queries", answering)
    before = len(entries())
    code, out, err = cli(["dp-icl", "--dataset", "movies-sample-director", "--model", "tiny-random",
                          "--noise-multiplier", "1", "--queries", "2", "--subsets", "4", "--shots", "2",
                          "--max-keywords", "3", "--seed", "3", "--json"])
    assert code == 0, err
    summary = json.loads(out)
    assert seen == [before + 1]
    mine = entries(summary["run_id"])
    assert len(mine) == 1 and mine[0].purpose == "dp-icl" and mine[0].steps == 2
    assert mine[0].noise_multiplier == pytest.approx(1.0)
    assert (summary["aggregation"], summary["max_keywords"], summary["queries"]) == ("keywords", 3, 2)
    assert summary["epsilon"] > 0 and summary["delta"] > 0
    assert summary["noise_std"] == pytest.approx(math.sqrt(6))
    assert "per keyword count, K=3 keywords per subset" in err
    # the released words are words of private test items: only their count is public, the answers private
    assert summary["answers"] == []
    assert json.loads((Path(summary["run_dir"]) / "dp_icl.json").read_text())["answers"] == []
    private = json.loads(Path(summary["private_answers"]).read_text())["answers"]
    assert "/private/" in summary["private_answers"] and [a["test_item"] for a in private] == [0, 1]
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    texts, gold = dp_icl.test_queries(load_dataset(load_task_spec("movies-sample-director")))
    released = [a["label"] for a in private]
    assert all(set(r.split()) <= set(keywords.keyword_space(t)) for r, t in zip(released, texts, strict=False))
    assert summary["labelled"] == 2
    assert summary["correct"] == sum(normalise_answer(r) == normalise_answer(g) for r, g in zip(released, gold[:2],
                                                                                                 strict=True))
