"""A run's plan, built once: what a run decided before anything is charged (`RunPlan`).

`build_run_plan` loads the dataset once (validated, its keyed content hash), picks delta (the flag, the
budget's delta the CLI put in the config, or 1/|D|), and plans every method the run names on that data, in the
registry's order, each by its own planner after its own checks (`tasks.methods.MethodEntry.plan`: DP few-shot
generation's `TangPlan`, PromptPATE's `PatePlan`, the others' `PrivacyPlan`s; held in `RunPlan.method_plans`),
then the audit's design and the plans of its DP demo sets from public counts (`tasks.audit`): every spend the run
will make. Nothing is written but the records' sketch beside the ledger (`tasks.ingest.load_data`); no model loads.

The CLI builds it, says it and dry-runs its spends (`dry_run`); the flows receive it in the same process
and charge its spends (`RunPlan.spends`), ingest its data (`tasks.ingest.ingest`, never reading the file
again) and run its methods without planning again. A run started elsewhere (a Prefect deployment, a
scheduled regeneration) builds its own: the plan holds the loaded records, so it never leaves the process
(`PlannedData`: Prefect stores it as a placeholder, never its content), and a plan's spends are always
keyed to the content hash of the records it holds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcore.audit.config import AuditConfig
from dpcore.audit.design import AuditDesign
from dpcore.config import RunConfig
from dpcore.data.datasets import LoadedDataset
from dpcore.fewshot.plan import default_delta
from dpcore.lm import runtime
from dpcore.privacy import ledger
from dpcore.privacy.plan import PrivacyPlan
from tasks.audit import AUDITED_METHOD, audit_generation_plans, audit_work, run_audit_design
from tasks.charge import budget_delta, charge_spends, plan_spends, preflight
from tasks.ingest import load_data
from tasks.methods import MethodPlan, entry, privacy_plans_of, registered_plans
from tasks.tang import TangPlan

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
class AuditPlan:
    """The run's audit planned from public counts (`tasks.audit.run_audit_design`): the configuration to
    run (None: skipped), its design, the line said about it (None: nothing to say), and the plans of the DP
    demo sets a regenerate-mode audit generates (`tasks.audit.audit_generation_plans`), charged with the run's
    other spends before anything runs."""

    config: AuditConfig | None
    design: AuditDesign
    note: str | None
    plans: tuple[PrivacyPlan, ...] = ()
    epsilons: int = 1  # the audited method's DP epsilons (a prompt audited at each)

    @property
    def demo_sets(self) -> int:
        return max(1, self.design.trials // self.config.trials) if self.config is not None else 1

    def work(self, config: RunConfig, *, labels: int, record_tokens: int) -> runtime.Work:
        """Its model work from public sizes (`tasks.audit.audit_work`); none for an audit skipped."""
        if self.config is None:
            return runtime.Work()
        return audit_work(config, self.config, self.design, epsilons=self.epsilons, labels=labels,
                          record_tokens=record_tokens)


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
    audit: AuditPlan | None
    held: PlannedData = field(repr=False, compare=False)
    # every named method's plan (`tasks.methods.MethodEntry.plan`), by method, in the registry's order: a
    # `tasks.methods.MethodPlan` (tang's `TangPlan`, PromptPATE's `PatePlan`) or a tuple of `PrivacyPlan`s
    method_plans: dict[str, MethodPlan | tuple[PrivacyPlan, ...]] = field(default_factory=dict)

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

    def method_plan(self, name: str) -> Any:
        """Method `name`'s plan (`method_plans`: tang's `TangPlan`, PromptPATE's `PatePlan`, the others' tuple of
        `PrivacyPlan`s), or None when the run does not name it."""
        return self.method_plans.get(name)

    def privacy_plans(self) -> list[PrivacyPlan]:
        """Every plan of the run, in the order the ledger charges them: each method's (`tasks.methods.privacy_plans_of`)
        in the registry's order, then the audit's DP demo sets."""
        return [*(plan for made in self.method_plans.values() for plan in privacy_plans_of(made)),
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
        for name, made in self.method_plans.items():  # each method's own (`tasks.methods.MethodEntry.work`)
            estimate = entry(name).work
            if estimate is not None:
                work += estimate(config, made, labels=labels, record_tokens=record, test_items=test_items)
        if self.audit is not None:  # the audit's, beside the methods'
            work += self.audit.work(config, labels=labels, record_tokens=record)
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
    data = load_data(config, config.audit_holdout_fraction)
    config = config.for_test_split(len(data.test))  # an unset --test-size: DEFAULT_TEST_ITEMS, or the split
    delta, source = delta_of(config, len(data.train))
    method_plans = registered_plans(config, data, float(delta), methods)  # each after its own checks
    return RunPlan(
        config=config, methods=methods, data_hash=data.content_hash, delta=float(delta), delta_source=source,
        labels=tuple(data.labels), label_counts=data.label_counts(), num_private_records=len(data.train),
        num_test=len(data.test), audit=_audit_plan(config, data, float(delta), method_plans.get(AUDITED_METHOD)),
        held=PlannedData(data), method_plans=method_plans)


def _audit_plan(config: RunConfig, data: LoadedDataset, delta: float, audited: TangPlan | None) -> AuditPlan | None:
    """The run's audit of the DP demonstrations of `audited` (the audited method's plan; None: the run makes none,
    nothing to audit), from public counts: its design (`tasks.audit.run_audit_design`) and the plans of a
    regenerate-mode audit's DP demo sets (`tasks.audit.audit_generation_plans`)."""
    if audited is None or not config.audit.enabled:
        return None
    counts = data.label_counts()
    held_out = len(data.audit) if config.audit_holdout_fraction is not None else len(data.test)  # its non-members
    audit_config, design, note = run_audit_design(config, counts, held_out)
    plans = audit_generation_plans(audited.generation, counts, audited.fewshot, delta, audit_config)
    return AuditPlan(audit_config, design, note, tuple(plans), epsilons=len(audited.fewshot.tang()))
