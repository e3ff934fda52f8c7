"""DP-OPT's release (Hong et al. 2024): its private instruction at one epsilon, read by the loader of a method
the registry plans (`dpcore.release.planned`) from its run's plan file, put in front of every prompt of the
task; what its guarantee assumes; its `ReleaseSpec`."""

from __future__ import annotations

from dpcore.dp_opt.privacy import METHOD
from dpcore.release.planned import load_planned_artifact
from dpcore.release.spec import DELTA_ASSUMPTION, INSTRUCTION, ReleaseSpec

ASSUMPTIONS = (
    "the number of records that write the instruction (n: the keyed-hash holdout excluded) is treated as "
    "public (it sets q = M k / n), as |D_y| is for DP few-shot generation",
    "the instruction is text with no record in it; its candidates' verbatim overlap with the private "
    "records is not checked by the audit (no demonstration to compare)",
    DELTA_ASSUMPTION)

RELEASE = ReleaseSpec(
    method=METHOD, kind=INSTRUCTION, load=load_planned_artifact,
    nothing_releasable="the run produced no DP-OPT instruction", assumptions=ASSUMPTIONS,
    plan_file="dp_opt_plan.json", artifact_file="dp_opt_instruction_eps{}.json", audit_file="audit_dp_opt.parquet")
