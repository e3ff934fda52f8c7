"""AdaDPSyn's release (Gao et al. 2024): its DP demonstrations at one epsilon, read by the loader of a method
the registry plans (`dpcore.release.planned`) from its run's plan file; Algorithm 1's assumptions (Tang et
al.'s, whose algorithm it runs); its `ReleaseSpec`."""

from __future__ import annotations

from dpcore.adadpsyn.plan import METHOD
from dpcore.fewshot.release import ASSUMPTIONS
from dpcore.release.planned import load_planned_artifact
from dpcore.release.spec import DEMONSTRATIONS, ReleaseSpec

RELEASE = ReleaseSpec(
    method=METHOD, kind=DEMONSTRATIONS, load=load_planned_artifact,
    nothing_releasable="the run produced no AdaDPSyn demonstrations", assumptions=ASSUMPTIONS,
    plan_file="adadpsyn_plan.json", artifact_file="adadpsyn_demos_eps{}.parquet",
    audit_file="audit_adadpsyn.parquet")
