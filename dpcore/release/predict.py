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
from dpcore.dpsgd.adapters import trained_scoring
from dpcore.dpsgd.soft_prompt import weights_hash
from dpcore.errors import ConfigError
from dpcore.lm import icl
from dpcore.names import RAW_SCORED_METHODS


def default_calibration(method: str | None) -> bool:
    """Whether a release of `method` is answered with contextual calibration unless the user says otherwise."""
    return method not in RAW_SCORED_METHODS


def answer(lm, spec: TaskSpec, demos: Sequence[tuple[str, str]], queries: Sequence[str],
           calibrate: bool = True, past=None) -> list[dict]:
    """One dict per query: `prediction` and, for classification, `probabilities` per label.

    `past`: a trained PromptDPSGD prompt's cache (`TrainablePrompt.cache_layers(lm)`, on the model it was
    trained on) before every prompt, usually with no demos (classification only)."""
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


def trained_model(lm, prompt_path, weights_sha256: str, trained_on: str):
    """(the model to answer with, the cache before every prompt) of a PromptDPSGD release
    (`adapters.trained_scoring`: a trained prompt's cache on `lm`, or `lm` with a LoRA adapter or fine-tuned
    weights applied), refused unless `lm` holds the weights it was trained on (`soft_prompt.weights_hash`):
    a trained prompt or adapter means nothing on another model."""
    if weights_hash(lm.model) != weights_sha256:
        raise ConfigError(f"model {lm.name!r}: a PromptDPSGD prompt or adapter answers only on the model it was "
                          f"trained on ({trained_on}, weight sha256 {weights_sha256[:12]}...)")
    return trained_scoring(lm, prompt_path)
