"""PromptPATE's student: a discrete prompt of k publicly labelled queries, chosen on public data only
(Duan et al. Section 4.2 "Student", Section 5.2).

Every answered query with its noisy label can be a demonstration. The candidates are disjoint
groups of k answered queries (k = 1: every answered query, up to `max_candidates`); each candidate
prompt labels the OTHER answered queries (validation) and the candidate whose predictions agree most
with their noisy labels is the student ("the best labeled public sequence as prompt data based on
the validation accuracy on the labeled public set"). No private record and no teacher is involved:
this is post-processing of the Confident-GNMax output and costs no privacy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcore.errors import ConfigError
from dpcore.flags import flag


@dataclass(frozen=True)
class StudentChoice:
    """The chosen candidate (positions into the answered queries) and every candidate's validation accuracy."""

    members: tuple[int, ...]
    candidate: int
    validation_accuracy: float
    accuracies: tuple[float, ...]


def student_candidates(answered: int, shots: int, max_candidates: int, rng: np.random.Generator) -> list[list[int]]:
    """Disjoint groups of `shots` positions among `answered` labelled queries, at most `max_candidates`."""
    if shots < 1:
        raise ConfigError(f"{flag('pate_shots')}: k must be >= 1, got {shots}")
    if max_candidates < 1:
        raise ConfigError(f"{flag('pate_student_candidates')}: must be >= 1, got {max_candidates}")
    if answered < shots + 1:
        return []  # no candidate with a validation query left: the caller reports no student
    order = rng.permutation(answered)
    groups = [sorted(int(i) for i in order[start:start + shots])
              for start in range(0, answered - shots + 1, shots)][:max_candidates]
    return [g for g in groups if len(g) == shots]


def select_student(predictions: np.ndarray, noisy_labels: np.ndarray, candidates: list[list[int]]) -> StudentChoice:
    """[C, A] each candidate's predicted label on the A answered queries, their [A] noisy labels ->
    the candidate with the best accuracy on the answered queries outside it (ties: the first)."""
    predictions = np.asarray(predictions)
    noisy_labels = np.asarray(noisy_labels)
    if not candidates:
        raise ConfigError(f"student: no candidate prompt (fewer answered queries than {flag('pate_shots')} + 1); "
                          f"lower {flag('pate_threshold')} or ask more {flag('pate_queries')}")
    accuracies = []
    for c, members in enumerate(candidates):
        keep = np.ones(noisy_labels.shape[0], dtype=bool)
        keep[members] = False
        accuracies.append(float(np.mean(predictions[c, keep] == noisy_labels[keep])))
    best = int(np.argmax(accuracies))
    return StudentChoice(tuple(candidates[best]), best, accuracies[best], tuple(accuracies))
