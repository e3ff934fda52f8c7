"""DP-ICL's private aggregation for extraction: keyword space aggregation over the query's own words (Wu et al.
2024, Section 3.3, keyword space aggregation, adapted to extraction).

For a query x each of the M subsets answers greedily (`dpcore.dp_icl.ensemble.ensemble_answers`). The keyword
space is PUBLIC: the distinct normalised words of x itself (`dpcore.lm.icl.normalise_answer`, split on
whitespace), in query order, never a word of a private record. A subset's vote is the set of its answer's
normalised words that lie in that space, capped at the first K = `max_keywords` in answer order (possibly empty).
The histogram c(w) counts the subsets whose vote holds w, over the query's keywords.

Sensitivity: adding or removing one record changes at most one subset (the subsets are disjoint,
`dpcore.dp_icl.subsets`), so at most one vote changes from a set S to a set S' of at most K keywords each: the
counts of S \\ S' drop by 1 and those of S' \\ S rise by 1, ||c - c'||_2 = sqrt(|S \\ S'| + |S' \\ S|) <=
sqrt(2K) (`keyword_sensitivity`), reached when S and S' are disjoint and full. The release adds N(0, s^2),
s = sigma sqrt(2K), to every keyword's count (a Gaussian mechanism of noise multiplier sigma on c) and releases
the keywords whose noisy count exceeds M / 2 (a fixed, public threshold: a majority of the subsets), joined in
query order with single spaces; none above it releases the empty answer. Thresholding and ordering are
post-processing of that Gaussian mechanism on a histogram over a public domain, so one query costs exactly the
classification path's event, `PoissonSampledDpEvent(q, GaussianDpEvent(sigma))` (`dpcore.dp_icl.privacy`).

How this differs from the paper: its keyword space aggregation builds the histogram over a vocabulary of
candidate keywords and selects the top ones with the joint exponential mechanism, or with propose-test-release
when the space is the subsets' own words, then has the model write an answer from them. Here the keyword space
is the query's own words, public to whoever asked it, which suits extraction, where the answer is a span of the
query: no vocabulary, no propose-test-release, no second generation; the released words are the answer.

Pure functions; noise comes from the `np.random.Generator` passed in. The subsets' answers, their votes and the
counts (noisy or not) are PRIVATE: only `release`'s string is public.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpcore.dp_icl.aggregation import noisy_histograms
from dpcore.dp_icl.subsets import check_count
from dpcore.errors import ConfigError
from dpcore.lm.icl import normalise_answer

DEFAULT_MAX_KEYWORDS = 4  # K: a director's or a genre's name fits; each keyword more costs sqrt(2K) noise


def keyword_sensitivity(max_keywords: int) -> float:
    """sqrt(2K): the histogram's L2 change when one subset's vote of at most K keywords changes arbitrarily."""
    return math.sqrt(2 * check_count("max_keywords", max_keywords))


def noise_std(noise_multiplier: float, max_keywords: int) -> float:
    """The per-keyword Gaussian noise std s = sigma x sqrt(2K) for a query noise multiplier sigma."""
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    return sigma * keyword_sensitivity(max_keywords)


def keyword_space(query: str) -> tuple[str, ...]:
    """The query's public keyword space: its distinct normalised words, in query order."""
    return tuple(dict.fromkeys(normalise_answer(query).split()))


def answer_keywords(answer: str, space: Sequence[str], max_keywords: int) -> tuple[str, ...]:
    """One subset's vote (PRIVATE): the distinct normalised words of its answer that lie in `space`, the first K
    in answer order."""
    k, allowed = check_count("max_keywords", max_keywords), set(space)
    found = [w for w in dict.fromkeys(normalise_answer(answer).split()) if w in allowed]
    return tuple(found[:k])


def keyword_histogram(votes: Sequence[Sequence[str]], space: Sequence[str]) -> np.ndarray:
    """[len(space)] counts (PRIVATE): c(w) = the votes holding keyword w (a vote counts a keyword once)."""
    index = {w: i for i, w in enumerate(space)}
    counts = np.zeros(len(index), dtype=np.float64)
    for vote in votes:
        for w in set(vote):
            if w not in index:
                raise ValueError("a vote holds a word outside the keyword space")
            counts[index[w]] += 1
    return counts


def noisy_counts(counts: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """counts + independent N(0, std^2) per keyword (PRIVATE: only `release`'s thresholded words are public)."""
    c = np.asarray(counts, dtype=np.float64).reshape(1, -1)
    if c.shape[1] == 0:
        return c[0].copy()
    return noisy_histograms(c, std, rng)[0]


def threshold(subsets: int) -> float:
    """M / 2: a keyword is released when its noisy count exceeds half the subsets (public, fixed)."""
    return check_count("subsets (M)", subsets) / 2


def release(counts: np.ndarray, space: Sequence[str], std: float, subsets: int, rng: np.random.Generator) -> str:
    """The released answer (PUBLIC): the keywords whose noisy count exceeds M / 2, in query order, joined by single
    spaces; "" when none does (std 0: the plain majority, not private)."""
    if len(counts) != len(space):
        raise ValueError("counts: one per keyword of the space expected")
    noisy = noisy_counts(counts, std, rng)
    return " ".join(w for w, c in zip(space, noisy.tolist(), strict=True) if c > threshold(subsets))


def aggregate(answers: Sequence[str], query: str, *, max_keywords: int, std: float,
              rng: np.random.Generator) -> str:
    """One query's released answer from its M subsets' greedy answers (PRIVATE in, PUBLIC out): votes over the
    query's keyword space, their histogram, the noisy majority (module docstring)."""
    space = keyword_space(query)
    votes = [answer_keywords(a, space, max_keywords) for a in answers]
    return release(keyword_histogram(votes, space), space, std, len(answers), rng)


__all__ = ["DEFAULT_MAX_KEYWORDS", "aggregate", "answer_keywords", "keyword_histogram", "keyword_sensitivity",
           "keyword_space", "noise_std", "noisy_counts", "release", "threshold"]
