"""DP-ICL's section of a run's configuration (`RunConfig.dp_icl`; Wu et al. 2024).

What a run sets of DP-ICL's ensemble: M disjoint exemplar subsets of at most k records, B test items per draw,
how a subset votes, and for extraction tasks the keywords K one subset's answer may vote for. An unset one is the paper's ensemble (`dpcore.dp_icl.presets`). In a run DP-ICL answers
the run's test items (Q = --test-size) at each finite epsilon > 0, its noise calibrated to answer all Q within
that epsilon (`tasks.dp_icl.plans`). Outside Python each field keeps its flat name `dp_icl_<field>`
(`--dp-icl-subsets`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpcore.section import Section


class DpIclSection(Section):
    """DP-ICL's settings (flat names `dp_icl_*`); None: the paper's."""

    PREFIX = "dp_icl_"

    subsets: int | None = Field(None, ge=1, description="DP-ICL: M, disjoint exemplar subsets voting on each "
                                "test item (default: the paper's 10)")
    shots: int | None = Field(None, ge=1, description="DP-ICL: k, most records in one subset's prompt "
                              "(default: the paper's 4)")
    queries_per_draw: int | None = Field(None, ge=1, description="DP-ICL: B, test items sharing one draw of "
                                         "subsets (default: 1, the paper's)")
    vote_mode: Literal["calibrated", "black-box"] | None = Field(
        None, description="DP-ICL: each subset's vote, its calibrated label probabilities or its greedy token "
        "(default: calibrated, the paper's)")
    max_keywords: int | None = Field(None, ge=1, description="DP-ICL on extraction tasks: K, most of the query's "
                                     "words one subset's answer votes for (noise std sigma*sqrt(2K); default 4)")


__all__ = ["DpIclSection"]
