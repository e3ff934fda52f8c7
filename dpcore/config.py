"""One run's whole configuration.

`RunConfig` is the single source: the CLI builds its flags from its fields
(`--num-subsets` for `num_subsets`), the Prefect flow takes it as its parameter,
`prefect.yaml` sets its fields, and MLflow logs `RunConfig.flat()` as params.
The smaller configs are typed views of it that dpcore functions take, so each function sees only what it uses;
each is declared in the subsystem that reads it and derived here: `GenerationConfig` (`dpcore/fewshot/config.py`),
`EvalConfig` (`dpcore/lm/config.py`), `AuditConfig` (`dpcore/audit/config.py`); they stay importable from here.

Its top level is the run itself: the data, the model, the budget (epsilons, delta), the evaluation, and Tang et
al.'s Algorithm 1, the run's core method, whose fields stay at the top (every method reads the data and budget
fields; AdaDPSyn reuses M, N, K, RVP and T_max; `GenerationConfig` is Algorithm 1's view of them). Symbols of
Tang et al. (Algorithm 1): M = num_subsets, N = subset_size, K = top_k, RVP = rvp, T_max = max_tokens, sigma =
noise multiplier. `max_record_tokens` is the public token cap applied to every private record before generation
(`dpcore.lm.budget`).

Every other method, and the audit, is a typed section (`dpcore.section.Section`), declared with its field
validators in its own subsystem and composed here: `RunConfig.audit` (`dpcore/audit/config.py`), `.pate`
(`dpcore/pate/config.py`), `.dpsgd`, `.adadpsyn`, `.dp_opt`, `.dp_icl`; code reads `config.pate.teachers`.
Checks that involve the run as well as a section stay in `RunConfig`'s own validators. A section's field keeps
its flat name outside Python (`pate_teachers`: `Section.flat_name`), so the run's external form is flat, as it
was before the sections: the CLI flags (`RunConfig.flat_names`, `flat_field`), `RunConfig(pate_teachers=8)` and
the nested `RunConfig(pate={"teachers": 8})` alike, a stored run's configuration, a `prefect.yaml` deployment's
keys and the flow parameter's JSON schema, `model_dump()` and `flat()` (MLflow params), `flag()` in messages,
`with_updates(pate_baselines=...)`, `flat_fields_set`.

This module sits above every dpcore subsystem: it imports their sections and views, none imports it. A message
names a setting through `dpcore.flags.flag` (kept importable here), with which this module registers the run's
flat names.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo

from dpcore.adadpsyn.config import AdaDPSynSection
from dpcore.audit.config import AuditConfig, AuditSection
from dpcore.data.taskspec import load_task_spec, shipped_task_names
from dpcore.dp_icl.config import DpIclSection
from dpcore.dp_opt.config import DpOptSection
from dpcore.dpsgd.config import DpsgdSection
from dpcore.errors import ConfigError
from dpcore.fewshot.config import GenerationConfig
from dpcore.flags import FLAG_SPELLINGS, cli_flag, flag, named, register  # noqa: F401  (kept importable here)
from dpcore.lm.config import EvalConfig
from dpcore.names import (
    DEFAULT_BASELINES,
    METHODS,
    AuditMode,
    Baseline,
    Mechanism,
    Method,
    Sampler,
    method_name,
)
from dpcore.pate.config import PateSection
from dpcore.section import Section

# A run's test items when --test-size is not given (`RunConfig.for_test_split`): one standard error of an
# accuracy is then about 5 points, and the evaluation a minute or two on 2 CPU cores.
DEFAULT_TEST_ITEMS = 100



class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunConfig(_Frozen):
    """Everything one pipeline run needs. Its flat field names (`flat_names`) are the CLI flag names."""

    methods: list[Method] = Field(
        default_factory=lambda: ["tang"],
        description="comma-separated private-prompting methods, run on the same data, test split and ledger: "
        "tang (DP few-shot generation), pate (PromptPATE), dpsgd (PromptDPSGD soft prompts), adadpsyn (AdaDPSyn's "
        "DP demonstrations), dp-opt (DP-OPT's private instruction), dp-icl (DP-ICL's private answers to the test "
        "items)")
    dataset: str = Field("agnews", description="a shipped task (agnews, trec, sst2, ...) or your task's name")
    data_path: str | None = Field(None, description="a user's CSV/JSONL/Parquet file (with --task-spec)")
    test_path: str | None = Field(
        None, description="a separate test file (same columns as the data file): the test split, instead of "
        "holding test rows out of the private file")
    task_spec: str | None = Field(None, description="path of a task YAML for a user dataset (kept resolved: a run "
                                  "reads the same file from any working directory)")
    dataset_id: str | None = Field(None, description="ledger identity; default: the dataset name (with "
                                   "--task-spec and no --dataset: the task spec's name)")
    new_budget_for_same_records: bool = Field(
        False, description="charge even when another dataset id already spends privacy on (largely) these "
        "records: a separate budget for the same records, knowingly (default: refused)")
    model: str = Field("smollm2-135m", description="the embedded model, a local model folder or a hub id")
    device: str = Field("auto", description="cpu, cuda or auto (CUDA when available)")
    dtype: str = Field("auto", description="float32, bfloat16, float16 or auto (bf16 on GPU, fp32 on CPU)")

    # The defaults of a run are sized so that a user's loop (set a budget, run, release, predict) on a file of
    # about 2,000 records closes in under 10 minutes on 2 CPU cores (benchmarks/RESULTS.md, "The own-data
    # loop"): one epsilon, 20-token demos from 5 groups of 1 record, 2 seeds on 100 test items, one audit demo
    # set. Larger sizes (M 10, N 2, T_max 40, several epsilons, 5 seeds: the earlier defaults) are flags.
    epsilons: list[float] = Field(default_factory=lambda: [4.0],
                                  description="comma-separated target epsilons; 0 = instruction-only demos")
    delta: float | None = Field(None, gt=0, lt=1, description="default: 1/|D_priv|")
    mechanism: Mechanism = Field("gaussian", description="per-token aggregation: Gaussian noise, or report-noisy-max")
    sampler: Sampler = Field("poisson", description="record sampler: poisson (what the accountant assumes) or fixed")
    num_subsets: int = Field(5, ge=1, description="M: disjoint groups of private records per token step")
    subset_size: int = Field(1, ge=1, description="N: expected records per group (q = MN/|D_y|)")
    top_k: int = Field(100, ge=1, description="K: public top-K vocabulary kept by RVP")
    rvp: bool = True
    max_tokens: int = Field(20, ge=1, description="T_max: token steps per demonstration")
    max_record_tokens: int | None = Field(
        None, ge=1, description="public token cap on each private record (default: the largest that fits the "
        "model's context with N records and max_tokens)")
    seed: int | None = Field(None, description="noise seed for experiments; None: cryptographically seeded")

    shots: int = Field(4, ge=0, description="demonstrations in each ICL prompt (generation makes ceil(shots/labels) per label)")
    seeds: int = Field(2, ge=1, description="evaluation seeds (choice and order of demos); accuracy is mean +/- std")
    test_size: int | None = Field(None, ge=1, description=f"test items evaluated (default: {DEFAULT_TEST_ITEMS}, or "
                                  "the whole test split when it is smaller; a size beyond the split is an error)")
    calibrate: bool = Field(True, description="contextual calibration of label probabilities (Zhao et al. 2021)")
    baselines: list[Baseline] = Field(
        default_factory=lambda: list(DEFAULT_BASELINES),
        description="comparison rows (default zero-shot; instruction-only, Tang et al.'s epsilon-0 demos, "
        "reads no record either); sigma-zero and random-real are "
        "non-private: opt-in, each charged to the ledger as an infinite spend")

    # The sections: each method's settings, and the audit's, declared and validated in its subsystem
    # (`dpcore/<method>/config.py`); outside Python every field keeps its flat name (`pate_teachers`).
    audit: AuditSection = Field(default_factory=AuditSection, description="the membership-inference audit "
                                "(flat names audit, audit_*, leak_auc, auc_tolerance, overlap_threshold)")
    pate: PateSection = Field(default_factory=PateSection, description="PromptPATE (flat names pate_*)")
    dpsgd: DpsgdSection = Field(default_factory=DpsgdSection, description="PromptDPSGD (flat names dpsgd_*)")
    adadpsyn: AdaDPSynSection = Field(default_factory=AdaDPSynSection, description="AdaDPSyn (flat names "
                                      "adadpsyn_*)")
    dp_opt: DpOptSection = Field(default_factory=DpOptSection, description="DP-OPT (flat names dp_opt_*)")
    dp_icl: DpIclSection = Field(default_factory=DpIclSection, description="DP-ICL (flat names dp_icl_*)")

    task_runner: str = Field("threads", description="threads, dask (a local cluster) or a Dask scheduler address")

    @model_validator(mode="before")
    @classmethod
    def _dataset_from_task_spec(cls, values):
        """A user dataset's identity comes from its task spec, never from the default dataset name:
        with `task_spec` and no `dataset`, `dataset` is the spec's `name`."""
        if isinstance(values, dict) and values.get("task_spec") and not values.get("dataset"):
            values = {**values, "dataset": load_task_spec(values["task_spec"]).name}
        return values

    @field_validator("task_spec")
    @classmethod
    def _resolve_task_spec(cls, value: str | None) -> str | None:
        """A task YAML's path made absolute, so what a run keeps (its manifest, its release) names the same file
        from any working directory; a shipped task's name (no suffix) stays a name."""
        if value is None or not Path(value).suffix:
            return value
        return str(Path(value).expanduser().resolve())

    @field_validator("task_runner")
    @classmethod
    def _check_task_runner(cls, value: str) -> str:
        return check_task_runner(value)

    @field_validator("epsilons", mode="before")
    @classmethod
    def _parse_epsilons(cls, value):
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        return [float(v) for v in value]

    @field_validator("epsilons")
    @classmethod
    def _check_epsilons(cls, value: list[float]) -> list[float]:
        for eps in value:
            if math.isnan(eps) or eps < 0:
                raise ValueError(f"epsilons: {eps} is not a valid epsilon (use a number >= 0, or inf)")
        return value

    @field_validator("methods", "baselines", mode="before")
    @classmethod
    def _parse_names(cls, value):
        """A comma-separated flag (`--methods tang,pate`) as its list of names."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return [method_name(v) for v in value] if isinstance(value, list) else value  # dp: tang's old name

    @field_validator("methods")
    @classmethod
    def _check_methods(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("methods: name at least one of " + ", ".join(METHODS))
        if len(set(value)) != len(value):
            raise ValueError(f"methods: {','.join(value)} names a method twice")
        return value

    @model_validator(mode="before")
    @classmethod
    def _fold_flat_names(cls, values):
        """The flat spelling (`pate_teachers: 8`, `audit: false`: the CLI's, a stored run's, prefect.yaml's,
        MLflow's) folded into the sections, beside or instead of the nested one (`pate: {teachers: 8}`); the
        text `None` (how `flat()` writes an unset field) is None for a field that may be unset."""
        return _folded(values) if isinstance(values, dict) else values

    @model_validator(mode="after")
    def _check_sources(self) -> RunConfig:
        if self.data_path and not self.task_spec and self.dataset not in _EMBEDDED_SPEC_NAMES():
            raise ValueError(f"{flag('data_path')} needs {flag('task_spec')} (a task YAML) unless {flag('dataset')} "
                             "names a shipped task")
        if self.shots == 0 and any(eps > 0 for eps in self.epsilons):
            raise ValueError(
                "shots 0: ICL prompts hold no demonstrations, so there is nothing to generate and no privacy to "
                "spend; use --shots >= 1 for DP demonstrations, or --epsilons 0 (instruction-only, no private data) "
                "to evaluate without them")
        return self

    @property
    def ledger_id(self) -> str:
        return self.dataset_id or self.dataset

    def _view(self, view: type[BaseModel], **fields):
        """The part of this run that `view` configures: each of its fields from the run's top-level field of
        the same name."""
        own = type(self).model_fields
        for name in view.model_fields:
            if name not in fields and name in own and name not in SECTIONS:
                fields[name] = getattr(self, name)
        return view(**fields)

    def generation_config(self) -> GenerationConfig:
        return self._view(GenerationConfig)

    def eval_config(self) -> EvalConfig:
        return self._view(EvalConfig)

    def for_test_split(self, num_test: int) -> RunConfig:
        """This configuration on a test split of `num_test` items: an unset `test_size` becomes
        `DEFAULT_TEST_ITEMS`, or the whole split when it is smaller (a public count); a set one stays."""
        if self.test_size is not None:
            return self
        return self.model_copy(update={"test_size": min(DEFAULT_TEST_ITEMS, num_test) or None})

    def audit_config(self) -> AuditConfig:
        """The audit's parameters: the audit section's fields of `AuditConfig`'s names, the mode resolved
        (`resolved_audit_mode`), the rows of its non-members (`audit_holdout_fraction`), as many non-members as
        members."""
        held_out = "holdout" if self.audit_holdout_fraction is not None else "test"
        return self.audit.resolved(self.resolved_audit_mode, held_out)

    @property
    def resolved_audit_mode(self) -> AuditMode:
        """--audit-mode as set; unset, run-demos: the run's own demos against held-out rows of the private file,
        no extra charge (`audit_holdout_fraction` says which rows with --test-path)."""
        return self.audit.mode if self.audit.mode is not None else "run-demos"

    @property
    def audit_holdout_fraction(self) -> float | None:
        """The fraction of the private file held out as the audit's non-members, or None: with --test-path and
        a run-demos audit only. A test file's rows need not be drawn like the private records, and the audit's
        false-alarm rate holds only for non-members that are; without --test-path the test split is held out
        of the private file already."""
        if self.test_path is None or not self.audit.enabled or self.resolved_audit_mode != "run-demos":
            return None
        return self.audit.holdout

    def flat(self) -> dict[str, str]:
        """Strings for MLflow params and manifests (public configuration only), by flat name; `RunConfig(**flat)`
        reads them back (a list comma-separated, an unset field `None`)."""
        out = {}
        for key, value in self.model_dump().items():
            out[key] = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        return out

    # --- the flat names: the CLI's, prefect.yaml's, a stored run's, MLflow's

    @classmethod
    def flat_names(cls) -> tuple[str, ...]:
        """Every field's flat name, in the order of the run's fields (a section's in place, in its order)."""
        return tuple(FLAT_FIELDS)

    @classmethod
    def flat_field(cls, name: str) -> FieldInfo:
        """The field a flat name stands for (its type, default, description: what its CLI flag is built from);
        ConfigError naming it when it is none."""
        section, field = _locate(name)
        return (SECTIONS[section] if section else cls).model_fields[field]

    def value(self, name: str) -> Any:
        """The value of the field of flat name `name` (`value("pate_teachers")` is `self.pate.teachers`)."""
        section, field = _locate(name)
        return getattr(getattr(self, section) if section else self, field)

    def with_updates(self, **updates: Any) -> RunConfig:
        """This configuration with the fields of flat names `updates` replaced (`with_updates(pate_teachers=8,
        delta=1e-5)`; a whole section by its name, `pate=PateSection(...)`); unvalidated and marked as set, as
        `model_copy(update=...)` is, which routes its updates here. A name that is no field is a ConfigError."""
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for name, value in updates.items():
            if name in SECTIONS and isinstance(value, Section):
                top[name] = value
                continue
            if name in SECTIONS and isinstance(value, dict):
                nested.setdefault(name, {}).update(value)
                continue
            section, field = _locate(name)
            if section:
                nested.setdefault(section, {})[field] = value
            else:
                top[field] = value
        for section, fields in nested.items():
            top[section] = top.get(section, getattr(self, section)).model_copy(update=fields)
        return super().model_copy(update=top)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> RunConfig:
        """`BaseModel.model_copy`, its `update` by flat names (`with_updates`)."""
        copied = super().model_copy(deep=deep)
        return copied.with_updates(**update) if update else copied

    @property
    def flat_fields_set(self) -> set[str]:
        """The flat names of the fields given explicitly (`model_fields_set`, a section's by its fields)."""
        names = {name for name in self.model_fields_set if name not in SECTIONS}
        for section, kind in SECTIONS.items():
            names |= {kind.flat_name(field) for field in getattr(self, section).model_fields_set}
        return names

    @model_serializer(mode="wrap")
    def _flat_form(self, handler) -> dict[str, Any]:
        """Dumped flat (`pate_teachers`), as before the sections: a run folder's stored configuration, the Prefect
        parameter and `--json` read the same as ever, and `RunConfig(**dumped)` reads it back."""
        data = handler(self)
        if not isinstance(data, dict):
            return data
        out = {}
        for key, value in data.items():
            if key in SECTIONS and isinstance(value, dict):
                out.update({SECTIONS[key].flat_name(field): item for field, item in value.items()})
            else:
                out[key] = value
        return out

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        """The flat form's schema (a Prefect deployment's parameter schema: prefect.yaml's keys are flat)."""
        return handler(_flat_model().__pydantic_core_schema__)


def check_task_runner(spec: str | None) -> str:
    """`threads` | `threads:N` | `dask` | `dask:N` | a Dask scheduler address (`tcp://host:8786`, `host:8786`);
    anything else is a configuration error, raised before a run charges the ledger."""
    text = (spec or "threads").strip()
    head, sep, tail = text.partition(":")
    if head in ("threads", "dask"):
        if not sep or (tail.isdigit() and int(tail) >= 1):
            return text
        raise ConfigError(f"{flag('task_runner')}: {text!r}: the worker count after {head}: must be an integer >= 1")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme in ("tcp", "tls", "inproc", "ucx", "ws", "wss") and rest:
            return text
    elif sep and head and tail.isdigit():
        return text
    raise ConfigError(f"{flag('task_runner')}: {text!r} is not threads, threads:N, dask, dask:N or a Dask scheduler address "
                     "(tcp://host:port)")


def demos_per_label(shots: int, num_labels: int) -> int:
    """Synthetic demos needed per label so an ICL prompt of `shots` demos can take one per chosen label."""
    return max(1, math.ceil(shots / max(1, num_labels)))


def _EMBEDDED_SPEC_NAMES() -> set[str]:
    return set(shipped_task_names())


# The sections by their attribute (`"pate": PateSection`), and every field's flat name (`"pate_teachers":
# ("pate", "teachers")`; a top-level field's: `"delta": (None, "delta")`), in the order of the run's fields.
SECTIONS: dict[str, type[Section]] = {
    name: info.annotation for name, info in RunConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, Section)}
FLAT_FIELDS: dict[str, tuple[str | None, str]] = {}
for _name in RunConfig.model_fields:
    if _name in SECTIONS:
        FLAT_FIELDS.update({SECTIONS[_name].flat_name(f): (_name, f) for f in SECTIONS[_name].model_fields})
    else:
        FLAT_FIELDS[_name] = (None, _name)
register(FLAT_FIELDS)  # `flag` names every field of the run from now on


def _locate(name: str) -> tuple[str | None, str]:
    """(section, field) of a flat name; ConfigError naming it when it is none."""
    if name not in FLAT_FIELDS:
        raise ConfigError(f"{name}: no RunConfig field is named so")
    return FLAT_FIELDS[name]


def _may_be_unset(info: FieldInfo) -> bool:
    annotation = info.annotation
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def _folded(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every flat name of a section's field moved into that section (module docstring)."""
    out: dict[str, Any] = {}
    given: dict[str, dict[str, tuple[str, Any]]] = {}
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, dict | Section):  # the nested spelling
            out[key] = value
            continue
        if isinstance(value, str) and value == "None" and key in FLAT_FIELDS and _may_be_unset(RunConfig.flat_field(key)):
            value = None
        section, field = FLAT_FIELDS.get(key, (None, key))
        if section is None:
            out[key] = value
        else:
            given.setdefault(section, {})[field] = (key, value)
    for section, fields in given.items():
        nested = out.get(section)
        merged = dict(nested.model_dump(exclude_unset=True) if isinstance(nested, Section) else nested or {})
        for field, (key, value) in fields.items():
            if field in merged and merged[field] != value:
                raise ValueError(f"{named(key)}: given twice, {value!r} and {section}.{field} {merged[field]!r}")
            merged[field] = value
        out[section] = merged
    return out


_FLAT_MODEL: list[type[BaseModel]] = []


def _flat_model() -> type[BaseModel]:
    """A model of the flat form, every field under its flat name (the JSON schema the Prefect parameter shows)."""
    if not _FLAT_MODEL:
        fields = {name: (RunConfig.flat_field(name).annotation, RunConfig.flat_field(name))
                  for name in FLAT_FIELDS}
        _FLAT_MODEL.append(create_model("RunConfig", __config__=ConfigDict(frozen=True, extra="forbid"),
                                        __doc__=RunConfig.__doc__, **fields))
    return _FLAT_MODEL[0]
