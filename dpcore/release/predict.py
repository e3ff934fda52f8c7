"""Answering queries with released demonstrations (post-processing of DP outputs: no privacy cost).

Classification: the label with the highest probability, scored exactly as in evaluation (`dpcore.lm.icl`):
contextually calibrated (Zhao et al.) for demonstrations, raw for a PromptDPSGD prompt. A trained prompt is
fitted to the raw label likelihood, and on public validation data (`benchmarks/utility.py`'s recipe choice)
raw scoring beat calibration for it; demonstrations gain from calibration. Extraction: greedy answers (Table
8 format).
"""

from __future__ import annotations

from collections.abc import Sequence

from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError
from dpcore.lm import icl
from dpcore.names import RAW_SCORED_METHODS


def default_calibration(method: str | None) -> bool:
    """Whether a release of `method` is answered with contextual calibration unless the user says otherwise."""
    return method not in RAW_SCORED_METHODS


def answer(lm, spec: TaskSpec, demos: Sequence[tuple[str, str]], queries: Sequence[str],
           calibrate: bool = True, past=None) -> list[dict]:
    """One dict per query: `prediction` and, for classification, `probabilities` per label.

    `past`: a trained prompt's cache before every prompt (its spec's `ReleaseSpec.applied_to_model`, on the model
    it was trained on), usually with no demos (classification only)."""
    if spec.kind == "extraction":
        if past is not None:
            raise ConfigError(f"task {spec.name!r}: a trained prompt answers classification tasks only")
        return [{"prediction": text} for text in icl.extract_answers(lm, spec, demos, queries)]
    labels = spec.label_names
    probs = icl.normalise_probs(icl.label_logprobs(lm, spec, demos, queries, labels, past=past))
    if calibrate:
        content_free = icl.normalise_probs(icl.label_logprobs(lm, spec, demos, list(icl.CONTENT_FREE_INPUTS), labels,
                                                              past=past))
        probs = icl.calibrate_probs(probs, content_free)
    return [{"prediction": labels[int(row.argmax())], "probabilities": dict(zip(labels, map(float, row), strict=True)),
             "calibrated": calibrate} for row in probs]
