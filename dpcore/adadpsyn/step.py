"""One AdaDPSyn token step from the model's logits: Tang et al.'s Algorithm 1 lines 6-10 (RVP, the groups'
restricted distributions) with PFIRR in place of lines 11-15, then the arg max (lines 16-19).

`choose_token` is the body of `dpcore.fewshot.generation.generate_demos`'s `choose` with the aggregation
swapped: RVP's public top-K set S (public prompt only), every non-empty group's distribution restricted to S
and renormalised (`restricted_softmax`), the M - G empty groups padded with the public distribution over S
(`dpcore.adadpsyn.pfirr.pad_groups`), PFIRR's scores (`adaptive_aggregate`) and their arg max mapped back to
a token id. `token_chooser` binds a generation's configuration and PFIRR parameters: the callable the
generation engine would call per (label, shot) and step with that stream's noise generator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dpcore.adadpsyn.params import PfirrParams
from dpcore.adadpsyn.pfirr import adaptive_aggregate, pad_groups
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.mechanisms import noisy_argmax, public_top_k, restricted_softmax

TokenChooser = Callable[[torch.Tensor | None, torch.Tensor, np.random.Generator], int]


def choose_token(public_logits: torch.Tensor | None, group_logits: torch.Tensor, *, num_groups: int,
                 top_k: int, rvp: bool, params: PfirrParams, rng: np.random.Generator) -> int:
    """The token of one step: `public_logits` [V] (the public prompt's; None only with RVP off) and
    `group_logits` [G, V] (the G <= M non-empty groups'), PFIRR with `params` and `rng` (the stream's noise
    generator). With RVP off the empty groups' point is the uniform distribution (no public prompt is run)."""
    keep = public_top_k(public_logits, top_k) if rvp else None
    probs = restricted_softmax(group_logits, keep)
    public = restricted_softmax(public_logits.unsqueeze(0), keep)[0] if public_logits is not None else None
    scores = adaptive_aggregate(pad_groups(probs, num_groups, public), params, rng)
    return noisy_argmax(scores, keep)


def token_chooser(config: GenerationConfig, params: PfirrParams) -> TokenChooser:
    """`choose_token` bound to a generation's M, K and RVP and to PFIRR's parameters."""
    def choose(public_logits: torch.Tensor | None, group_logits: torch.Tensor, rng: np.random.Generator) -> int:
        return choose_token(public_logits, group_logits, num_groups=int(config.num_subsets),
                            top_k=int(config.top_k), rvp=bool(config.rvp), params=params, rng=rng)

    return choose


__all__ = ["TokenChooser", "choose_token", "token_chooser"]
