"""Answering queries with released demonstrations (post-processing of DP outputs: no privacy cost).

Classification: the label with the highest contextually calibrated probability (Zhao et al.),
scored exactly as in evaluation (`dpcore.icl`). Extraction: greedy answers (Table 8 format).
"""

from __future__ import annotations

from collections.abc import Sequence

from dpcore import icl
from dpcore.taskspec import TaskSpec


def answer(lm, spec: TaskSpec, demos: Sequence[tuple[str, str]], queries: Sequence[str],
           calibrate: bool = True) -> list[dict]:
    """One dict per query: `prediction` and, for classification, `probabilities` per label."""
    if spec.kind == "extraction":
        return [{"prediction": text} for text in icl.extract_answers(lm, spec, demos, queries)]
    labels = spec.label_names
    probs = icl.normalise_probs(icl.label_logprobs(lm, spec, demos, queries, labels))
    if calibrate:
        content_free = icl.normalise_probs(icl.label_logprobs(lm, spec, demos, list(icl.CONTENT_FREE_INPUTS), labels))
        probs = icl.calibrate_probs(probs, content_free)
    return [{"prediction": labels[int(row.argmax())], "probabilities": dict(zip(labels, map(float, row), strict=True))}
            for row in probs]
