"""AdaDPSyn's section of a run's configuration (`RunConfig.adadpsyn`; Gao et al. 2024).

PFIRR's public parameters, the paper's by default (`dpcore.adadpsyn.params.PAPER`) and never tuned on private data.
M, N, K, RVP and T_max are the run's own (Algorithm 1's, `RunConfig`'s top level); sigma_avg is calibrated to each
epsilon (`dpcore.adadpsyn.plan`). Outside Python each field keeps its flat name `adadpsyn_<field>`
(`--adadpsyn-coverage`).
"""

from __future__ import annotations

from pydantic import Field

from dpcore.section import Section


class AdaDPSynSection(Section):
    """AdaDPSyn's settings (flat names `adadpsyn_*`): `PfirrParams` but the calibrated sigma_avg."""

    PREFIX = "adadpsyn_"

    sigma_radius: float = Field(15.0, gt=0, description="AdaDPSyn: noise multiplier of the radius "
                                "search's queries (std 2 sigma_radius on L(r)); the paper's 15")
    sigma_test: float = Field(5.0, gt=0, description="AdaDPSyn: noise multiplier of each coverage test "
                              "(std sigma_test on a count); the paper's 5")
    tolerance: float = Field(0.1, gt=0, lt=0.7071, description="AdaDPSyn: the radius search stops at this "
                             "bracket width; the paper's 0.1")
    coverage: float = Field(0.8, gt=0, le=1, description="AdaDPSyn: share t of the M groups the radius "
                            "covers; the paper's 0.8")
    shrink: float = Field(0.25, ge=0, description="AdaDPSyn: lambda, the last noise the next radius allows "
                          "for; the paper's 0.25")
    test_fraction: float = Field(0.55, ge=0, le=1, description="AdaDPSyn: mu_test, the share of groups a "
                                 "smaller ball must hold; the paper's 0.55")
    updates: int = Field(2, ge=0, description="AdaDPSyn: T_update, radius reductions per token at most; "
                         "the paper's 2")


__all__ = ["AdaDPSynSection"]
