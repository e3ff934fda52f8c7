"""A run's plan, built once: what a run decided before anything is charged (`RunPlan`).

`build_run_plan` loads the dataset once (validated, its keyed content hash), picks delta (the flag, the
budget's delta the CLI put in the config, or 1/|D|), and plans every method the run names on that data:
DP few-shot generation's `FewShotPlan` (a sigma per epsilon, `dpcore.fewshot.plan`), PromptPATE's settings,
public queries and plans (`tasks.pate`), PromptDPSGD's plans (`tasks.tune`), every registered method's plans
(`tasks.methods`: AdaDPSyn's, DP-OPT's), and the audit's design and the
plans of its DP demo sets from public counts (`tasks.audit`): every spend the run will make. Nothing is written but the records' sketch beside the
ledger (`tasks.ingest.load_data`); no model loads.

The CLI builds it, says it and dry-runs its spends (`dry_run`); the flows receive it in the same process
and charge its spends (`RunPlan.spends`), ingest its data (`tasks.ingest.ingest`, never reading the file
again) and run its methods without planning again. A run started elsewhere (a Prefect deployment, a
scheduled regeneration) builds its own: the plan holds the loaded records, so it never leaves the process
(`PlannedData`: Prefect stores it as a placeholder, never its content), and a plan's spends are always
keyed to the content hash of the records it holds.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dpcore.audit.design import AuditDesign
from dpcore.config import AuditConfig, GenerationConfig, RunConfig
from dpcore.data.datasets import LoadedDataset
from dpcore.errors import ConfigError
from dpcore.fewshot.plan import FewShotPlan, default_delta, fewshot_plan
from dpcore.lm import runtime
from dpcore.lm.icl import check_test_size
from dpcore.privacy import ledger
from dpcore.privacy.plan import PrivacyPlan
from tasks import pate as pate_stage
from tasks import tune as tune_stage
from tasks.audit import audit_generation_plans, run_audit_design
from tasks.calibrate import plan_arguments
from tasks.charge import budget_delta, charge_spends, plan_spends, preflight
from tasks.ingest import load_data
from tasks.methods import entry, registered_plans

DELTA_SOURCES = ("flag", "budget", "1/|D|")


class PlannedData:
    """The loaded dataset a plan was made from, held in this process only: never copied, never encoded
    (Prefect's parameter store gets `<RunPlan>`, not the records: `jsonable_encoder` can neither iterate
    nor read the attributes of a slotted object)."""

    __slots__ = ("_data",)

    def __init__(self, data: LoadedDataset):
        self._data = data

    def get(self) -> LoadedDataset:
        return self._data

    def __deepcopy__(self, memo):  # `dataclasses.asdict` deep-copies fields: the records stay one object
        return self

    def __copy__(self):
        return self

    def __repr__(self) -> str:
        return "<records held in memory>"


@dataclass(frozen=True)
class PatePlan:
    """PromptPATE's decision on the data (`tasks.pate.check_inputs`, `tasks.pate.privacy_plans`): its
    Confident-GNMax settings, its plans (one per repeat set, and the non-private baselines' when asked), the
    queries each repeat labels, and the public queries (public text) with where they come from."""

    settings: dict
    plans: tuple[PrivacyPlan, ...]
    per_repeat: int
    queries: pd.DataFrame = field(repr=False, compare=False)
    source: str = ""


@dataclass(frozen=True)
class AuditPlan:
    """The run's audit planned from public counts (`tasks.audit.run_audit_design`): the configuration to
    run (None: skipped), its design, the line said about it (None: nothing to say), and the plans of the DP
    demo sets a regenerate-mode audit generates (`tasks.audit.audit_generation_plans`), charged with the run's
    other spends before anything runs."""

    config: AuditConfig | None
    design: AuditDesign
    note: str | None
    plans: tuple[PrivacyPlan, ...] = ()

    @property
    def demo_sets(self) -> int:
        return max(1, self.design.trials // self.config.trials) if self.config is not None else 1


@dataclass(frozen=True)
class RunPlan:
    """What a run decided before anything is charged, built once (`build_run_plan`)."""

    config: RunConfig
    methods: tuple[str, ...]
    data_hash: str
    delta: float
    delta_source: str                   # one of DELTA_SOURCES
    labels: tuple[str, ...]
    label_counts: dict[str, int]        # |D_y|, public as in Tang et al.
    num_private_records: int
    num_test: int
    generation: GenerationConfig | None  # Algorithm 1's parameters (DP few-shot generation)
    fewshot: FewShotPlan | None
    pate: PatePlan | None
    dpsgd: tuple[PrivacyPlan, ...]
    audit: AuditPlan | None
    held: PlannedData = field(repr=False, compare=False)
    # the plans of every method the registry plans (`tasks.methods.MethodEntry.plan`), by method
    method_plans: dict[str, tuple[PrivacyPlan, ...]] = field(default_factory=dict)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        # a flow parameter (`validate_parameters`) is checked as an instance, never rebuilt field by field
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(cls)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema, handler) -> dict:
        # a deployment's parameter form has no field for it: a run started there plans itself
        return {"title": "RunPlan", "description": "in-process only; a deployment run builds its own"}

    @property
    def data(self) -> LoadedDataset:
        """The records the plan was made from (in this process only)."""
        return self.held.get()

    def privacy_plans(self) -> list[PrivacyPlan]:
        """Every plan of the run, in the order the ledger charges them: DP few-shot generation's, PromptPATE's,
        PromptDPSGD's, the registered methods' (in the run's order), the audit's DP demo sets."""
        return ([*self.fewshot.privacy_plans()] if self.fewshot is not None else []) + \
            [*(self.pate.plans if self.pate is not None else ()), *self.dpsgd,
             *(plan for name in self.methods for plan in self.method_plans.get(name, ())),
             *(self.audit.plans if self.audit is not None else ())]

    def spends(self, run_id: str | None) -> list[tuple[str, float, ledger.Spend]]:
        """The run's ledger requests under `run_id` (a dry run's: "dry-run"), on the plan's content hash."""
        return plan_spends(self.config.ledger_id, self.data_hash, run_id or "dry-run", self.privacy_plans())

    def dry_run(self, run_id: str | None) -> dict:
        """The charge checked against the dataset's budget, nothing recorded (over budget:
        `BudgetExceededError`; records another dataset id spends on: `SameRecordsError`; both exit 3)."""
        return charge_spends(self.config.ledger_id, self.spends(run_id), dry_run=True,
                             same_records_ok=self.config.new_budget_for_same_records)

    def work(self) -> runtime.Work:
        """The run's model work in token positions, from public sizes only (`dpcore.lm.runtime`): every
        record, test item and candidate taken as the public cap's length, or a typical one without a cap."""
        config = self.config
        record = config.max_record_tokens or runtime.TYPICAL_RECORD_TOKENS
        labels = len(self.labels)
        test_items = min(config.test_size or self.num_test, self.num_test)  # (set by `build_run_plan`)
        work = runtime.Work()
        if self.fewshot is not None:
            demos = max(1, math.ceil(config.shots / max(labels, 1)))
            rows = self.fewshot.generations()
            sizes = dict(labels=labels, num_subsets=config.num_subsets, subset_size=config.subset_size,
                         max_tokens=config.max_tokens, record_tokens=record)
            generation = sum(runtime.generation_positions(demos_per_label=demos, private=method != "instruction-only",
                                                          **sizes) for method, _, _ in rows)
            demo_rows = len(rows) + sum(b == "random-real" for b in config.baselines)
            runs = config.seeds * demo_rows + ("zero-shot" in config.baselines)
            work += runtime.Work(generation=generation,
                                 evaluation=runtime.evaluation_positions(test_items, labels, runs, record))
            if self.audit is not None and self.audit.config is not None:
                from dpcore.audit.attacks import passes_per_record

                audit_config = self.audit.config
                audit_record = min(record, audit_config.max_record_tokens or record)
                dp_epsilons = len(self.fewshot.tang())
                audit = runtime.audit_positions(self.audit.design.scored_records,
                                                passes_per_record(audit_config.reference_prompts), audit_record,
                                                epsilons=max(dp_epsilons, 1))
                if audit_config.mode == "regenerate":  # its demo sets: one demo per label each, per epsilon
                    audit += dp_epsilons * audit_config.demo_sets * runtime.generation_positions(
                        demos_per_label=1, **sizes)
                if config.audit.reference:  # real records as 1-shot demos: as many pairs again
                    audit += runtime.audit_positions(self.audit.design.scored_records, 2, audit_record)
                work += runtime.Work(audit=audit)
        if self.pate is not None:
            s = self.pate.settings
            work += runtime.Work(pate=runtime.pate_positions(
                int(s["teachers"]), self.pate.per_repeat, int(s.get("repeats", 1)), int(s["student_candidates"]),
                test_items, labels, record))
        for plan in self.dpsgd:
            p = plan.parameters
            work += runtime.Work(dpsgd=runtime.dpsgd_positions(int(p["steps"]), int(p["batch_size"]),
                                                               int(p["trainings"]), test_items, labels, record))
        evaluations = config.seeds * sum(len(plans) for plans in self.method_plans.values())
        for name, plans in self.method_plans.items():  # each registered method's own work (`MethodEntry.work`)
            estimate = entry(name).work
            for plan in plans if estimate is not None else ():
                work += estimate(config, plan, labels=labels, record_tokens=record)
        if evaluations:  # every registered method's prompt scored on the test items, once per seed
            work += runtime.Work(evaluation=runtime.evaluation_positions(test_items, labels, evaluations, record))
        return work

    def estimated_seconds(self) -> float:
        """The run's wall time estimated from `work` at the measured rate (`dpcore.lm.runtime.seconds`):
        the device and threads asked for, the model's size from its folder when it is one."""
        device = _auto_device() if self.config.device == "auto" else self.config.device
        threads = os.cpu_count() if device == "cpu" else None
        return runtime.seconds(self.work(), device=device, threads=threads,
                               parameters=runtime.model_parameters(self.config.model))

    def made_from(self, config: RunConfig) -> bool:
        """Whether `config` reads the same records as the plan's (the same source, split and budget)."""
        keys = ("dataset", "data_path", "task_spec", "test_path", "ledger_id")
        return all(getattr(config, k) == getattr(self.config, k) for k in keys)


def _auto_device() -> str:
    """What `--device auto` will pick, without importing torch when it is not loaded yet (an NVIDIA driver
    present and not hidden: CUDA)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
    return "cuda" if Path("/proc/driver/nvidia/version").exists() and not hidden else "cpu"


def delta_of(config: RunConfig, num_private_records: int) -> tuple[float, str]:
    """(delta, where it came from): the configuration's (the budget's delta when the CLI set it from the
    ledger's budget, else the flag), or 1/|D| (the papers' default)."""
    if config.delta is None:
        return default_delta(num_private_records), "1/|D|"
    return config.delta, "budget" if budget_delta(config.ledger_id) == config.delta else "flag"


def build_run_plan(config: RunConfig, methods: Iterable[str] | None = None) -> RunPlan:
    """The run's plan: the dataset loaded once, delta, every named method's plan after its own checks on the
    data, the audit's design. `methods` defaults to the configuration's. The plan's `config` is `config` with
    an unset `test_size` resolved on the test split (`RunConfig.for_test_split`): the flow runs that one."""
    methods = tuple(methods if methods is not None else config.methods)
    preflight(config)  # the task runner spec and the model's context, before the data is read
    data = load_data(config)
    config = config.for_test_split(len(data.test))  # an unset --test-size: DEFAULT_TEST_ITEMS, or the split
    delta, source = delta_of(config, len(data.train))
    counts = data.label_counts()
    generation, fewshot, audit = None, None, None
    if "tang" in methods:
        arguments = plan_arguments(config, counts, delta)
        generation = arguments["generation"]
        fewshot = fewshot_plan(**arguments)
        if config.audit.enabled:
            audit_config, design, note = run_audit_design(config, counts, len(data.test))
            audit = AuditPlan(audit_config, design, note, tuple(audit_generation_plans(
                generation, counts, fewshot, delta, audit_config)))
    return RunPlan(
        config=config, methods=methods, data_hash=data.content_hash, delta=float(delta), delta_source=source,
        labels=tuple(data.labels), label_counts=counts, num_private_records=len(data.train),
        num_test=len(data.test), generation=generation, fewshot=fewshot,
        pate=_pate_plan(config, data, delta) if "pate" in methods else None,
        dpsgd=_dpsgd_plans(config, data) if "dpsgd" in methods else (), audit=audit, held=PlannedData(data),
        method_plans=registered_plans(config, data, float(delta), methods))


def _pate_plan(config: RunConfig, data: LoadedDataset, delta: float) -> PatePlan:
    """PromptPATE's plan after every check on the data (`tasks.pate.check_inputs`: flock size, GNMax
    parameters, test size, the public queries)."""
    if data.spec.kind != "classification":
        raise ConfigError(f"pate: PromptPATE votes on labels; task {data.spec.name!r} is not a classification task")
    queries, where, settings = pate_stage.check_inputs(config, data, delta)
    plans, per_repeat = pate_stage.privacy_plans(config, settings, delta)
    return PatePlan(settings, tuple(plans), per_repeat, queries.head(per_repeat), where)


def _dpsgd_plans(config: RunConfig, data: LoadedDataset) -> tuple[PrivacyPlan, ...]:
    """PromptDPSGD's plans (`tasks.tune.plans`: batch within the training records, sigma reachable) after its
    checks: a classification task, `--test-size` within the test split."""
    if data.spec.kind != "classification":
        raise ConfigError(f"methods: PromptDPSGD trains prompts for classification tasks; task "
                          f"{data.spec.name!r} is {data.spec.kind}")
    check_test_size(config.test_size, len(data.test))
    return tuple(tune_stage.plans(config, len(data.train)))

