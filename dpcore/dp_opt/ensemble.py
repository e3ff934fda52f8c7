"""DP-OPT's ensemble: each demo subset's meta prompt and its vote for the instruction's next token.

The meta prompt is APE's forward-generation template as the authors use it (`utils/dln.py`, `InstructGenerator`,
instruct_type "vicuna"): "I gave a friend an instruction. Based on the instruction they produced the following
input-output pairs:", the subset's demonstrations, then "The instruction was to" and the tokens released so far.
Demonstrations are written in the task's own ICL format (`TaskSpec.icl.demo`), the format the instruction will
later be used with. Deliberate difference: the authors' DP runs use the DLN-1 backward template (the current
instruction's successes and errors on the demonstrations); the forward template needs no extra model pass per
record and is their `InstructGenerator` path.

Each subset votes one token: a sample of its next-token distribution at the run's temperature (the authors'
`do_sample=True, gen_temp`), or its argmax at temperature 0; end-of-text is masked before `min_tokens` (their
`MinLengthLogitsProcessor`). The sampling draws exactly one uniform per subset, whatever the subsets hold, so a
neighbouring dataset's run with the same generator gives every unchanged subset the same vote (the coupling the
neighbour test uses). A subset with no record does not vote.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpcore.data.taskspec import TaskSpec

META_HEADER = ("I gave a friend an instruction. Based on the instruction they produced the following "
               "input-output pairs:\n\n\n")
META_FOOTER = "\n\nThe instruction was to"


def meta_prompt(spec: TaskSpec, demos: Sequence[tuple[str, str]], generated: str = "") -> str:
    """The meta prompt of one subset: header, its (text, label) demonstrations in the task's ICL format, the
    footer and the instruction released so far."""
    body = "".join(spec.icl.demo(text, spec.verbalizer(label) if spec.kind == "classification" else label)
                   for text, label in demos)
    return META_HEADER + body.rstrip() + META_FOOTER + generated


def votes_from_logits(logits: torch.Tensor | np.ndarray, temperature: float, uniforms: np.ndarray,
                      banned: Sequence[int] = ()) -> np.ndarray:
    """One vote per row of next-token logits [S, V]: inverse-CDF sampling of softmax(logits / temperature) with
    the given uniforms [S] (temperature 0: the argmax); `banned` token ids get probability 0."""
    x = torch.as_tensor(logits, dtype=torch.float64).clone()
    if banned:
        x[:, list(banned)] = -torch.inf
    if temperature == 0:
        return x.argmax(dim=1).numpy()
    probs = torch.softmax(x / temperature, dim=1).numpy()
    cdf = np.cumsum(probs, axis=1)
    picks = [int(np.searchsorted(row, u * row[-1], side="right")) for row, u in zip(cdf, uniforms, strict=True)]
    return np.minimum(np.asarray(picks, dtype=np.int64), probs.shape[1] - 1)


def subset_votes(lm, spec: TaskSpec, subsets: Sequence[Sequence[tuple[str, str]]], generated_ids: Sequence[int],
                 temperature: float, rng: np.random.Generator, *, ban_end: bool = False) -> list[int]:
    """The votes (PRIVATE) of the non-empty subsets for the next token after `generated_ids`, in subset order.
    Draws len(subsets) uniforms from `rng` first, empty subsets included."""
    uniforms = rng.random(len(subsets))
    voting = [i for i, demos in enumerate(subsets) if demos]
    if not voting:
        return []
    prompts = [lm.encode(meta_prompt(spec, subsets[i])) + list(generated_ids) for i in voting]
    logits = lm.next_token_logits(prompts)
    banned = sorted(lm.eos_token_ids) if ban_end else []
    return [int(v) for v in votes_from_logits(logits, temperature, uniforms[voting], banned)]
