"""Algorithm 1's parameters for one generation call (Tang et al., Algorithm 1): `GenerationConfig`.

Symbols of the paper: M = num_subsets, N = subset_size, K = top_k, RVP = rvp (lines 7-10), T_max = max_tokens.
A run's are its top-level fields of the same names (`RunConfig.generation_config()`, `dpcore/config.py`, which
sits above this subsystem and derives the view); the audit's regenerate mode and AdaDPSyn read the same view.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dpcore.names import Mechanism, Sampler


class GenerationConfig(BaseModel):
    """Parameters of Algorithm 1 for one generation call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_subsets: int = Field(10, ge=1, description="M: disjoint groups of private records per token step")
    subset_size: int = Field(2, ge=1, description="N: expected records per group (MN/|D_y| is the sampling rate)")
    top_k: int = Field(100, ge=1, description="K: public top-K vocabulary kept when RVP is on")
    rvp: bool = Field(True, description="Reduce vocabulary publicly (Algorithm 1 lines 7-10)")
    max_tokens: int = Field(40, ge=1, description="T_max: token steps per demonstration")
    mechanism: Mechanism = "gaussian"
    sampler: Sampler = Field(
        "poisson",
        description="poisson: the sampler the accountant models. fixed: the paper's code "
        "(MN records without replacement), bounded by the same accountant under add/remove "
        "neighbours (proof in dpcore.fewshot.sampling).",
    )
    demos_per_label: int = Field(1, ge=1, description="synthetic demonstrations generated per label")
    max_record_tokens: int | None = Field(
        None, ge=1,
        description="public cap: every private record is cut to this many tokens before generation; "
        "default: the largest cap for which the instruction, N records and max_tokens fit the model's context",
    )


__all__ = ["GenerationConfig"]
