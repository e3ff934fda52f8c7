"""DP-OPT's section of a run's configuration (`RunConfig.dp_opt`; Hong et al. 2024).

What a run sets of DP-OPT's private instruction: the ensemble (M subsets of k demonstrations), the candidates (J
of T tokens) and the subsets' temperature. An unset one is the preset's (`dpcore.dp_opt.presets`: gpu = the
paper's `PAPER`, cpu = `SMOKE`, seconds on a CPU), resolved by `tasks.dp_opt`. Outside Python each field keeps its
flat name `dp_opt_<field>` (`--dp-opt-subsets`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpcore.section import Section


class DpOptSection(Section):
    """DP-OPT's settings (flat names `dp_opt_*`); None: the preset's."""

    PREFIX = "dp_opt_"

    preset: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="DP-OPT: defaults of the unset dp_opt_* fields: gpu = Hong et al. (205 subsets of 5, "
        "40 candidates of 50 tokens), cpu = a CPU size (8 subsets of 2, 2 candidates of 6 tokens, a 1% "
        "holdout); auto: by device")
    subsets: int | None = Field(None, ge=1, description="DP-OPT: M, demo subsets voting on each token")
    shots: int | None = Field(None, ge=1, description="DP-OPT: k, demonstrations per subset")
    max_tokens: int | None = Field(None, ge=1, description="DP-OPT: T, tokens per candidate instruction")
    candidates: int | None = Field(None, ge=1, description="DP-OPT: J, candidate instructions (J > 1: one "
                                   "chosen privately on a keyed-hash holdout)")
    temperature: float | None = Field(None, ge=0, description="DP-OPT: each subset's sampling temperature "
                                      "(0: its argmax; the paper's 1.1)")


__all__ = ["DpOptSection"]
