"""What a private-prompting method's release is (`ReleaseSpec`, declared once by each method's subsystem) and
what one release publishes (`Artifact`, read from a finished run's public files by the spec's loader).

The gate, the manifest, the release audit, `dpicl predict` and `dpicl export` read a release through these two
types only: what differs between methods is a field of the spec (its kind, files, texts, loader) or of the
artifact, never a branch on a method's name. A method declares its spec in its own subsystem
(`dpcore/<method>/release.py`); the method registry (`tasks.methods.MethodEntry.release_spec`) hands it to the
shared code, so `dpcore.release` never imports a method's subsystem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import pandas as pd

# What a release publishes: demonstrations (text and label pairs), an instruction (text in front of a
# zero-shot prompt), or a trained prompt (tensors meaningful on one model only).
ReleaseKind = Literal["demonstrations", "instruction", "trained-prompt"]
DEMONSTRATIONS: ReleaseKind = "demonstrations"
INSTRUCTION: ReleaseKind = "instruction"
TRAINED_PROMPT: ReleaseKind = "trained-prompt"
TEXT_KINDS: tuple[ReleaseKind, ...] = (DEMONSTRATIONS, INSTRUCTION)  # a release with a text form (`dpicl export`)
# Which private records the release audit takes as members (the records the mechanism read): a teacher
# assignment's (disjoint teachers), those some Poisson batch drew (its private training record), or every
# training record (each could be sampled: q > 0).
MembersRead = Literal["teachers", "sampled", "every-record"]
# Where a release's assumptions state its delta: replaced in every manifest by `dpcore.release.gate.delta_assumption`,
# the delta the run used and where it came from.
DELTA_ASSUMPTION = "delta: the run's, and where it came from"
# The method of a release manifest written before manifests named their method (the only method then).
UNNAMED_METHOD = "tang"


class Loader(Protocol):
    """A method's artifact at the selector asked for (`epsilon`, `training`, `repeat`: a loader reads those
    its method has and refuses, in one line, one its method cannot honour), from public files only."""

    def __call__(self, spec: ReleaseSpec, run_id: str, home: Path, *, epsilon: float | None = None,
                 training: int = 0, repeat: int | None = None) -> Artifact: ...


class ModelApplier(Protocol):
    """A trained prompt on a model: (the model to answer with, the cache before every prompt), refused in one
    line unless `lm` holds the weights it was trained on (`weights_sha256`, of `trained_on`)."""

    def __call__(self, lm, artifact_file: Path, weights_sha256: str, trained_on: str) -> tuple: ...


@dataclass(frozen=True)
class ReleaseSpec:
    """What releasing one method publishes and how it is read, declared once in the method's subsystem."""

    method: str  # its `dpcore.names.Method` name
    kind: ReleaseKind
    load: Loader  # its artifact from a finished run's public files (`Loader`)
    nothing_releasable: str  # the gate's line when the run made nothing to release
    assumptions: tuple[str, ...]  # what its guarantee assumes (DELTA_ASSUMPTION: the run's delta, stated)
    plan_file: str | None = None  # the public plan of its run (its plans as charged, seeded flag, data identity)
    artifact_file: str | None = None  # its public artifact per epsilon in the run folder ("{}": the epsilon)
    audit_file: str | None = None  # the public table of its release audit; None: audited by its own run
    members: MembersRead = "every-record"  # what its release audit takes as members
    released_what: str | None = None  # how a refusal names the spend released ("demos'"); None: "<method> prompt's"
    export_parameters: tuple[str, ...] | None = None  # its export's top-level parameters; None: all, in full
    # the samplers its accountant covers: an artifact drawn with any other is refused (`Artifact.samplers`)
    accounted_samplers: tuple[str, ...] = ("poisson",)
    # how its artifact is put on a model to answer (a trained prompt, on its own model only); None: a text prompt
    applied_to_model: ModelApplier | None = None

    @property
    def audited_at_release(self) -> bool:
        """Whether `dpicl release` audits the artifact first (else its own run audited it)."""
        return self.audit_file is not None

    @property
    def spend_owner(self) -> str:
        return self.released_what or f"{self.method} prompt's"


@dataclass(frozen=True)
class Artifact:
    """What one release publishes, for every method, read from a finished run's public files by its spec's loader
    (`ReleaseSpec.load`). The gate, the manifest and the registry read only this; what differs between methods
    is in its fields."""

    method: str  # one of METHODS
    run_id: str
    path: Path  # the public run folder
    name: str  # "demos" (tang) | "student-r<repeat>" | the trained prompt's file stem ("dpsgd-eps8-0")
    epsilon: float
    delta: float
    spends: tuple[dict, ...]  # what the ledger must hold: mechanism, noise_multiplier, sampling_rate, steps, purpose
    seeded_noise: bool
    info: dict  # model, dataset, dataset_id, data_hash, task_spec, parameters (+ a trained prompt: weights hash...)
    demos: tuple[tuple[str, str], ...] = ()  # the released demonstrations: (text, label)
    prompt_path: Path | None = None  # a trained prompt: the safetensors file
    changed_files: tuple[str, ...] = ()
    # the public audit table; rows are matched by `artifact` when the table has that column (audited at release)
    audit: pd.DataFrame | None = field(default=None, compare=False)
    samplers: tuple[str, ...] = ()  # the samplers the accountant must cover ("unrecorded": the run did not say)
    ledger_purposes: tuple[str, ...] | None = None  # a covering entry's purposes; None: each spend's own
    crosscheck_agreed: bool | None = None  # as recorded when calibrated; None: recomputed on the spends
    table: pd.DataFrame | None = field(default=None, compare=False)  # the rows of the released demos file
    selector: dict = field(default_factory=dict, compare=False)  # the flags that pick this artifact again
    task_spec: dict | None = None  # the task spec the run was made with (`runs.run_task_spec`), as JSON
    delta_source: str | None = None  # where the run's delta came from (`runs.run_delta_source`); None: not recorded
    assumptions: tuple[str, ...] = ()  # what its guarantee assumes (its spec's), as its loader states it
    # (q, T) when the records the mechanism read are a Poisson draw whose realised count is private (DP-SGD's
    # batches): the release audit then designs from public bounds on it; None when that count is public
    drawn_records: tuple[float, int] | None = None
    instruction: str | None = None  # an instruction release: the instruction (its task spec holds it in front)
    spec: ReleaseSpec | None = field(default=None, compare=False, repr=False)  # its method's, set by its loader

    @property
    def dataset_id(self) -> str:
        return str(self.info.get("dataset_id") or self.info.get("dataset") or "")

