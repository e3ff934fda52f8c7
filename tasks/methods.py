"""The method registry: every private-prompting method a run may name (`--methods`), one `MethodEntry` each.

A method is the unit of the product. Its entry says, in one place, what the rest of dpicl needs of it:

- `name`: its `dpcore.names.Method` (the plan's name, the ledger purpose of its spends, its rows' `method`);
- `config_section`: its section of `RunConfig` by attribute (`"pate"`: `RunConfig.pate`, a `dpcore.section.Section`
  declared and validated in `dpcore/<method>/config.py`, its fields' flat names and flags `<prefix>*`); None: the
  run's own top-level fields (tang: Algorithm 1's);
- `plan(config, data, delta) -> MethodPlan`: its plan on the run's loaded data, after its own checks (each check a
  method makes before the charge is in its planner); `tasks.run_plans.build_run_plan` calls every named method's
  once per run, in the registry's order, and holds it in `RunPlan.method_plans[name]` (`RunPlan.method_plan`).
  A `MethodPlan` is a typed value whose `privacy_plans()` are the `PrivacyPlan`s the method charges (tang's
  `tasks.tang.TangPlan`, PromptPATE's `tasks.pate.PatePlan` with its settings and public queries), or a plain
  tuple of `PrivacyPlan`s (the others'; `privacy_plans_of` reads both); their spends join every other method's
  in the run's ONE ledger charge, in the registry's order. None: the method plans nothing in a run;
- `subflow`: what the pipeline runs of it, `"module:NAME"`, a `flows.methods.MethodFlow` (its stages or Prefect
  subflow on the run's one charge; what must run before the charge; what to mark right after it), resolved by
  the flow layer (`flows.methods.method_flow`), so tasks never import flows. Its `run` returns a public summary
  with `results` (rows: method, epsilon, delta, noise_multiplier, accuracy_mean, accuracy_std,
  calibrated_accuracy_mean, calibrated_accuracy_std, n) and `seeded_noise`;
- `artifacts`: the file names (globs) of its public artifact in the run folder (what a release loads);
- `release`: whether `dpicl release` releases it (its `release_spec` says how);
- `results`: the public table of its rows in the run folder (None: in `results.parquet`);
- `release_spec`: what its release is (`dpcore.release.spec.ReleaseSpec`, declared in its subsystem: its kind,
  plan, artifact and audit files, texts and loader), which the release gate, the release audit, `dpicl predict`
  and `dpicl export` read (`release_spec`); None: nothing to release;
- `work(config, method_plan, labels=, record_tokens=, test_items=) -> dpcore.lm.runtime.Work`: its plan's model
  work in token positions from public sizes (the run's time estimate, `tasks.run_plans.RunPlan.work`);
  `each_plan(estimate)` makes one from a single `PrivacyPlan`'s estimate (every plan's, and its prompt evaluated on
  the test items once per seed). None: it has none;
- `audited_in_run(summary) -> [(epsilon, selected)]`: which of its artifacts the run's membership audit checks when
  the run asks for it (`audit_methods`), from its public run summary: each artifact's epsilon and the `--epsilon`
  that selects it in `tasks.release.audit_artifact` (None: its only one). None: no in-run audit.

A method `dpicl run --methods` runs is a `dpcore.names.Method`. A prediction method (`dpcore.names.
PREDICTION_METHODS`: dp-icl) is one too: in a run it answers the run's test items; its commands of its own serve
further answers; it releases no prompt. Registering a new method: its subsystem under dpcore/, its stages in
tasks/<method>.py, its subflow in flows/<method>.py, its name in `dpcore.names.Method`, its `RunConfig` section, its `ReleaseSpec` (when
it releases something) in dpcore/<method>/release.py, and one entry here (`register`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dpcore.adadpsyn.release import RELEASE as ADADPSYN_RELEASE
from dpcore.config import RunConfig
from dpcore.data.datasets import LoadedDataset
from dpcore.dp_opt.release import RELEASE as DP_OPT_RELEASE
from dpcore.dpsgd.release import RELEASE as DPSGD_RELEASE
from dpcore.errors import ConfigError
from dpcore.fewshot.release import RELEASE as TANG_RELEASE
from dpcore.lm.runtime import Work, evaluation_positions
from dpcore.names import METHODS, PREDICTION_METHODS
from dpcore.pate.release import RELEASE as PATE_RELEASE
from dpcore.privacy.plan import PrivacyPlan
from dpcore.release.spec import ReleaseKind, ReleaseSpec
from tasks import adadpsyn as adadpsyn_stage
from tasks import dp_icl as dp_icl_stage
from tasks import dp_opt as dp_opt_stage
from tasks import pate as pate_stage
from tasks import tang as tang_stage
from tasks import tune as tune_stage


@runtime_checkable
class MethodPlan(Protocol):
    """A method's plan richer than its `PrivacyPlan`s (tang's `TangPlan`, PromptPATE's `PatePlan`): what it charges."""

    def privacy_plans(self) -> Sequence[PrivacyPlan]: ...


# (the run's config, its loaded data, delta) -> the method's plan: a `MethodPlan` or a tuple of `PrivacyPlan`s
Planner = Callable[[RunConfig, LoadedDataset, float], "MethodPlan | tuple[PrivacyPlan, ...]"]
# (the run's config, the method's plan, labels=, record_tokens=, test_items=) -> its model work (`MethodEntry.work`)
WorkEstimate = Callable[..., Work]


def privacy_plans_of(method_plan: MethodPlan | Iterable[PrivacyPlan]) -> tuple[PrivacyPlan, ...]:
    """The `PrivacyPlan`s a method's plan charges, in order: a `MethodPlan`'s `privacy_plans()`, or the plans of a
    plain tuple."""
    if isinstance(method_plan, MethodPlan):
        return tuple(method_plan.privacy_plans())
    return tuple(method_plan)


def each_plan(estimate: Callable[..., Work]) -> WorkEstimate:
    """A `MethodEntry.work` from `estimate(config, plan, labels=, record_tokens=)`, one `PrivacyPlan`'s own model
    work: summed over the method's plans, then its prompt (or answers) scored on the test items once per plan and
    seed (`dpcore.lm.runtime.evaluation_positions`)."""

    def work(config: RunConfig, method_plan, *, labels: int, record_tokens: int, test_items: int) -> Work:
        plans = privacy_plans_of(method_plan)
        total = Work()
        for plan in plans:
            total += estimate(config, plan, labels=labels, record_tokens=record_tokens)
        if plans:
            total += Work(evaluation=evaluation_positions(test_items, labels, config.seeds * len(plans), record_tokens))
        return total

    return work


@dataclass(frozen=True)
class MethodEntry:
    """One private-prompting method's part of the protocol (module docstring)."""

    name: str
    title: str
    config_section: str | None
    plan: Planner | None
    subflow: str | None
    artifacts: tuple[str, ...]
    release: bool
    results: str | None = None
    release_spec: ReleaseSpec | None = None
    work: WorkEstimate | None = None
    audited_in_run: Callable[[dict], list[tuple[float, float | None]]] | None = None


REGISTRY: dict[str, MethodEntry] = {}


def register(entry: MethodEntry) -> MethodEntry:
    """Add `entry` to the registry; a name twice, or one `dpcore.names.Method` does not know, is an error."""
    if entry.name in REGISTRY:
        raise ConfigError(f"methods: {entry.name!r} is registered twice")
    if entry.name not in METHODS + PREDICTION_METHODS:
        raise ConfigError(f"methods: {entry.name!r} is no dpcore.names.Method; name it there first")
    REGISTRY[entry.name] = entry
    return entry


def entry(name: str) -> MethodEntry:
    """The registered method `name` (ConfigError naming the registered ones otherwise)."""
    if name not in REGISTRY:
        raise ConfigError(f"methods: {name!r} is none of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def release_spec(name: str) -> ReleaseSpec:
    """What releasing method `name` publishes (`MethodEntry.release_spec`); ConfigError naming the methods that
    have a release otherwise."""
    found = REGISTRY.get(name)
    if found is None or found.release_spec is None:
        releasable = [n for n, e in REGISTRY.items() if e.release_spec is not None]
        raise ConfigError(f"--method: one of {', '.join(releasable)}, got {name!r}")
    return found.release_spec


def release_specs() -> tuple[ReleaseSpec, ...]:
    """Every registered method's release, in the registry's order."""
    return tuple(e.release_spec for e in REGISTRY.values() if e.release_spec is not None)


def release_kind(name: str) -> ReleaseKind | None:
    """What method `name`'s prompt holds (`ReleaseSpec.kind`: demonstrations, an instruction, a trained prompt);
    None for a name with no release (a baseline: zero-shot, random-real, ...)."""
    found = REGISTRY.get(name)
    return found.release_spec.kind if found is not None and found.release_spec is not None else None


def registered_plans(config: RunConfig, data: LoadedDataset, delta: float, methods: Iterable[str]
                     ) -> dict[str, MethodPlan | tuple[PrivacyPlan, ...]]:
    """{method: its plan} for every method of `methods` (`MethodEntry.plan`, each after its own checks on the data),
    in the registry's order: the order the run's spends are charged and its methods run. A name the registry does
    not know: ConfigError."""
    named = {entry(name).name for name in methods}
    return {name: found.plan(config, data, delta) for name, found in REGISTRY.items()
            if name in named and found.plan is not None}


register(MethodEntry("tang", "DP few-shot generation (Tang et al. 2024, Algorithm 1)", None, tang_stage.method_plan,
                     "flows.tang:TANG", ("demos.parquet",), True, release_spec=TANG_RELEASE, work=tang_stage.work))
register(MethodEntry("pate", "PromptPATE (Duan et al. 2023, Section 4.2)", "pate", pate_stage.method_plan,
                     "flows.pate:PATE", ("pate_students.parquet",), True, "pate_results.parquet",
                     release_spec=PATE_RELEASE, work=pate_stage.work,
                     audited_in_run=pate_stage.audited_in_run))
register(MethodEntry("dpsgd", "PromptDPSGD (Duan et al. 2023, Section 4.1)", "dpsgd", tune_stage.method_plan,
                     "flows.tune:DPSGD", ("prompts/dpsgd-*.safetensors",), True, "dpsgd_results.parquet",
                     release_spec=DPSGD_RELEASE, work=tune_stage.work,
                     audited_in_run=tune_stage.audited_in_run))
register(MethodEntry("adadpsyn", "AdaDPSyn (Gao et al. 2024): DP demonstrations by data-adaptive aggregation",
                     "adadpsyn", adadpsyn_stage.plans, "flows.adadpsyn:ADADPSYN",
                     (ADADPSYN_RELEASE.artifact_file.format("*"),), True, "adadpsyn_results.parquet",
                     release_spec=ADADPSYN_RELEASE, work=each_plan(adadpsyn_stage.work)))
register(MethodEntry("dp-opt", "DP-OPT (Hong et al. 2024): a private instruction", "dp_opt", dp_opt_stage.plans,
                     "flows.dp_opt:DP_OPT", (DP_OPT_RELEASE.artifact_file.format("*"),), True,
                     "dp_opt_results.parquet", release_spec=DP_OPT_RELEASE, work=each_plan(dp_opt_stage.work)))
register(MethodEntry(name="dp-icl", title="DP-ICL (Wu et al. 2024): private prediction by a noisy vote of exemplar "
                     "subsets", config_section="dp_icl", plan=dp_icl_stage.plans, subflow="flows.dp_icl:DP_ICL",
                     artifacts=(dp_icl_stage.ANSWERS_FILE.format("*"),), release=False,
                     results=dp_icl_stage.RESULTS_FILE, work=each_plan(dp_icl_stage.work)))
