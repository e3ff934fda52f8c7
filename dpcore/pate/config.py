"""PromptPATE's section of a run's configuration (`RunConfig.pate`; Duan et al. Section 4.2, App. C.2).

What a run sets of PromptPATE: the flock (E teachers of k shots), the public queries, Confident-GNMax's threshold
and noise (T, sigma1, sigma2), its accounting and the student's choice. An unset size is the preset's
(`dpcore.pate.presets`, resolved by `tasks.pate`); the checks against the run's epsilons and data happen when the
run is planned. Outside Python each field keeps its flat name `pate_<field>` (`--pate-teachers`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dpcore.names import PateAccounting, PateBaseline, PatePublic, PateVoteMode
from dpcore.section import Section


class PateSection(Section):
    """PromptPATE's settings (flat names `pate_*`)."""

    PREFIX = "pate_"

    preset: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="defaults of the unset pate_* fields (teachers, queries, sigma1, sigma2, student "
        "candidates): gpu = Duan et al. Table 7 (E 200, Q 500, sigma2 20), cpu = minutes on the embedded model "
        "(E 20, Q 50, sigma1 = sigma2 = 10); auto: by device")
    teachers: int | None = Field(None, ge=1, description="E: teacher prompts, built from disjoint private "
                                 "records (default: the preset's, 200 on GPU, 20 on CPU)")
    shots: int = Field(1, ge=1, description="k: demonstrations per teacher prompt (and per student prompt)")
    public: PatePublic = Field("iid", description="public queries: iid (the task's public split), ood (the "
                               "task YAML's pate.ood_public dataset) or file (pate_public_path)")
    public_path: str | None = Field(None, description="a CSV/JSONL/Parquet file of public queries (text column "
                                    "only); implies pate_public file")
    public_column: str = Field("text", description="the text column of pate_public_path")
    queries: int | None = Field(None, ge=1, description="Q: public queries each repeat may label, at most; "
                                "the plan labels as many as the epsilon affords (default: the preset's, 500 "
                                "on GPU, 50 on CPU)")
    threshold: float | None = Field(None, description="T: Confident-GNMax threshold on the top vote count "
                                    "(default round(0.9 E): Table 7's 180 at E = 200)")
    sigma1: float | None = Field(None, description="threshold noise std (default: the CPU preset's 10; on "
                                 "GPU the task YAML's, Table 7: 1, 5 for AG News)")
    sigma2: float | None = Field(None, description="GNMax noise std on the vote counts (default: the preset's, "
                                 "Table 7's 20 on GPU, 10 on CPU)")
    vote_mode: PateVoteMode = Field("calibrated", description="calibrated (argmax of calibrated label "
                                    "probabilities) or black-box (greedy next token; other tokens vote 'other')")
    target_epsilon: float | None = Field(None, gt=0, description="PromptPATE's epsilon (all repeats together, "
                                         "data-independent): labelling stops before it would be exceeded "
                                         "(default: the largest epsilon of epsilons; inf: every query "
                                         "asked, charged at its data-independent bound)")
    accounting: PateAccounting = Field(
        "data-independent", description="how the labelling is charged: data-independent (its bound for any votes, "
        "charged before any teacher votes: the default) or data-dependent (Papernot et al. 2018: the "
        "smooth-sensitivity release of an upper bound on the labelling's data-dependent cost, which fails with "
        "probability delta0 added to delta, is charged before any teacher votes, the released bound after the "
        "labelling and before any label is published; over the epsilon asked, nothing is published)")
    gnss_order: float | None = Field(None, gt=1, description="data-dependent: the Renyi order of the release "
                                     "(default: the largest of 2-64 where the analysis applies at sigma2)")
    gnss_beta: float | None = Field(None, gt=0, description="data-dependent: the smoothness beta (default "
                                    "0.4 / order, lowered so the bound's noise is at most twice sigma_ss)")
    gnss_sigma: float = Field(10.0, gt=0, description="data-dependent: sigma_ss, the release's noise scale")
    gnss_delta0: float | None = Field(None, gt=0, lt=1, description="data-dependent: the probability that "
                                      "the released upper bound falls below the labelling's data-dependent "
                                      "cost, part of delta (default: half the run's delta)")
    repeats: int = Field(3, ge=1, description="noisy labellings and student choices (fresh noise each); "
                         "accuracy is mean +/- std over them, each charged")
    student_candidates: int | None = Field(None, ge=1, description="candidate student prompts evaluated on "
                                           "the public validation queries (default: the preset's, 50 on GPU, "
                                           "10 on CPU)")
    baselines: list[PateBaseline] = Field(
        default_factory=lambda: ["zero-shot"],
        description="comparison rows: zero-shot; ensemble (the flock's vote on the test split) and upper-bound (the "
        "best single teacher on the test split) are non-private: opt-in, charged as an infinite spend")
    teacher_block: int = Field(25, ge=1, description="teachers per mapped flock-scoring task")

    @field_validator("baselines", mode="before")
    @classmethod
    def _parse_baselines(cls, value):
        """A comma-separated flag (`--pate-baselines zero-shot,ensemble`) as its list of names."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="before")
    @classmethod
    def _public_path_means_file(cls, values):
        """A public file given means the file source."""
        if isinstance(values, dict) and values.get("public_path") and not values.get("public"):
            values = {**values, "public": "file"}
        return values

    @model_validator(mode="after")
    def _check_public(self) -> PateSection:
        if self.public_path and self.public != "file":
            raise ValueError(f"{self.flag('public_path')} is a public file, but {self.flag('public')} is "
                             f"{self.public!r}: give one of them")
        return self


__all__ = ["PateSection"]
