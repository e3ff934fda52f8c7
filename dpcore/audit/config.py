"""The audit's section of a run's configuration (`RunConfig.audit`): what a run sets of its membership audit.

Whether the run audits (`enabled`, the flag `--audit`/`--no-audit`), the audit's sizes (trials, members, demo sets),
its mode and its gate (the test, the leak it is sized to detect, the tolerance, the verbatim overlap), and the
extra audits a run may add (the non-private reference, the release audit of the other methods). Outside Python
each field keeps its flat name, `audit_<field>` (`audit_holdout`: a split of the private file, made when the data
is loaded; `AuditConfig.held_out` says only whether the audit reads it), but for the switch (`audit`) and the gate's three (`leak_auc`,
`auc_tolerance`, `overlap_threshold`), which were named before the section was.

`AuditConfig` is what the audit's procedures, design and gate take: the section resolved (`AuditSection.resolved`,
which `RunConfig.audit_config()` calls with the run's mode), every setting of the same name as the section's, the
mode decided, as many non-members as members. A setting has one name in both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dpcore.names import AuditMode, AuditTest
from dpcore.section import Section


class AuditConfig(BaseModel):
    """The audit's parameters, as its procedures take them (the mode decided)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    trials: int = Field(20, ge=1, description="trials per demo set (DP audit) or in total (non-private audit)")
    demo_sets: int = Field(3, ge=1, description="independently generated DP demo sets")
    members: int = Field(50, ge=1)
    non_members: int = Field(50, ge=1)
    test: AuditTest = Field("detect", description="detect: the gate fails when an attack's interval of the AUC "
                            "excludes 0.5, sized to detect a leak of leak_auc with probability power; equivalence: "
                            "it passes only when every interval lies inside 0.5 +/- auc_tolerance")
    leak_auc: float = Field(0.75, gt=0.5, lt=1, description="detect: the leak (mean per-trial AUC) the audit is "
                            "sized to detect")
    power: float = Field(0.95, gt=0, lt=1, description="detect: the probability of detecting a leak of leak_auc")
    auc_tolerance: float = Field(0.05, gt=0, lt=0.5, description="equivalence: |AUC - 0.5| must stay within this")
    overlap_threshold: int = Field(8, ge=1, description="gate: verbatim token overlap that counts as a leak")
    confidence: float = Field(0.95, gt=0, lt=1)
    reference_prompts: int = Field(0, ge=0, description="OUT prompts (1-shot prompts of non-candidate records) "
                                   "of the offline LiRA attacks, each one more forward pass per record; fewer than "
                                   "2 (the default): the three calibrated attacks only, no LiRA")
    max_record_tokens: int | None = Field(None, ge=1, description="score each candidate's first N tokens only "
                                          "(a public cap that makes a time-boxed audit cheaper); None: whole text")
    mode: AuditMode = Field("run-demos", description="run-demos: the run's own demos vs held-out records (nothing "
                            "charged); regenerate: DP demos generated from half the private records (Tang et al. "
                            "App. F, charged)")
    held_out: Literal["test", "holdout"] = Field("test", description="run-demos: its non-members are the test split "
                                                 "(held out of the private file), or the private file's rows held "
                                                 "out for the audit (a run with a separate test file)")


class AuditSection(Section):
    """The run's audit settings (flat names `audit_*`, `audit`, `leak_auc`, `auc_tolerance`, `overlap_threshold`);
    its fields share `AuditConfig`'s names where they are the same setting."""

    PREFIX = "audit_"
    FLAT_NAMES = {"enabled": "audit", "leak_auc": "leak_auc", "auc_tolerance": "auc_tolerance",
                  "overlap_threshold": "overlap_threshold"}

    enabled: bool = Field(True, description="run the membership-inference audit (Duan et al.) on the DP demos")
    trials: int = Field(20, ge=1, description="audit trials per demo set")
    demo_sets: int = Field(1, ge=1, description="DP demo sets a regenerate-mode audit generates from its "
                           "members, each charged")
    members: int = Field(50, ge=1, description="member (and as many non-member) records per audit trial")
    mode: AuditMode | None = Field(None, description="run-demos (the default): the run's own demos, training "
                                   "vs held-out rows of the private file, nothing charged; regenerate: DP demos "
                                   "from a member half, scored against the other half, charged")
    holdout: float = Field(0.1, gt=0, lt=1, description="with --test-path: the fraction of the private file held "
                           "out (each record by a keyed hash of its id) as the run-demos audit's non-members, "
                           "read by no method (the test file's rows need not share the private file's "
                           "distribution)")
    test: AuditTest = Field("detect", description="detect: the audit gate fails when an attack distinguishes "
                            "members from non-members, sized by --leak-auc and --audit-power; equivalence: it "
                            "passes only when every AUC interval lies inside 0.5 +/- --auc-tolerance (about "
                            "1,460 records per side at 0.05)")
    leak_auc: float = Field(0.75, gt=0.5, lt=1, description="audit (detect): the leak, a mean per-trial AUC, that the "
                            "audit is sized to detect")
    power: float = Field(0.95, gt=0, lt=1, description="audit (detect): the probability of detecting a leak of "
                         "--leak-auc")
    reference: bool = Field(False, description="also run the non-private reference audit (real records as "
                            "1-shot demos, Duan et al.'s leaky setting) for contrast: an infinite spend, "
                            "charged to the ledger")
    methods: bool = Field(True, description="with audit on, also the release audit of PromptPATE's chosen "
                          "student and each PromptDPSGD prompt (nothing generated or charged; `dpicl release "
                          "--audit-only` runs it later)")
    reference_prompts: int = Field(0, ge=0, description="R >= 2 adds the offline LiRA attacks against R "
                                   "OUT prompts built from non-members (R more forward passes per record); "
                                   "default 0: the three calibrated attacks")
    max_record_tokens: int | None = Field(None, ge=1, description="score only each record's first tokens "
                                          "(default: whole records)")
    auc_tolerance: float = Field(0.05, gt=0, lt=0.5, description="audit gate (--audit-test equivalence): |AUC - 0.5| "
                                 "must stay within this")
    overlap_threshold: int = Field(8, ge=1, description="audit gate: verbatim token overlap that counts as a leak")

    def resolved(self, mode: AuditMode, held_out: Literal["test", "holdout"] = "test") -> AuditConfig:
        """The `AuditConfig` of these settings with the audit's `mode` and the rows of its non-members decided (the
        run decides them: `RunConfig.audit_config`): every field of a name both have, as many non-members as
        members."""
        shared = {name: getattr(self, name) for name in AuditConfig.model_fields if name in type(self).model_fields}
        return AuditConfig(**{**shared, "non_members": self.members, "mode": mode, "held_out": held_out})

    def __bool__(self) -> bool:
        # `config.audit` was the run's audit switch before it was a section: a reader still testing it would read
        # every section as true, so it fails loudly instead
        raise TypeError("RunConfig.audit is the audit's section; its switch is RunConfig.audit.enabled")


__all__ = ["AuditConfig", "AuditSection"]
