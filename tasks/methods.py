"""The method registry: every private-prompting method a run may name (`--methods`), one `MethodEntry` each.

A method is the unit of the product. Its entry says, in one place, what the rest of dpicl needs of it:

- `name`: its `dpcore.names.Method` (the plan's name, the ledger purpose of its spends, its rows' `method`);
- `config_prefix`: its section of `RunConfig` (`dpcore/config.py`, the fields named `<prefix>*`, validated there);
- `plan(config, data, delta) -> tuple[PrivacyPlan, ...]`: its plans on the run's loaded data, after its own
  checks; `tasks.run_plans.build_run_plan` calls it once per run, and the plans' spends join every other
  method's in the run's ONE ledger charge. None: the run plan holds the method's plans in fields of its own
  (tang's `FewShotPlan`, PromptPATE's `PatePlan`, PromptDPSGD's plans: planned before the registry);
- `subflow`: what the pipeline runs of it, `"module:NAME"`, a `flows.methods.MethodFlow` (its stages or Prefect
  subflow on the run's one charge; what must run before the charge; what to mark right after it), resolved by
  the flow layer (`flows.methods.method_flow`), so tasks never import flows. Its `run` returns a public summary
  with `results` (rows: method, epsilon, delta, noise_multiplier, accuracy_mean, accuracy_std,
  calibrated_accuracy_mean, calibrated_accuracy_std, n) and `seeded_noise`;
- `artifacts`: the file names (globs) of its public artifact in the run folder (what a release loads);
- `release`: whether the release gate (`dpcore.release.gate`) has a loader for it;
- `results`: the public table of its rows in the run folder (None: in `results.parquet`).

A method `dpicl run --methods` runs is a `dpcore.names.Method`; a method of the field with commands of its own
(`dpcore.names.PREDICTION_METHODS`: dp-icl) may register too, for its plan, artifact and release, and joins `--methods`
when its name joins `Method`. Registering a method (dp-icl, or a new one): its subsystem under dpcore/, its stages in tasks/<method>.py, its
subflow in flows/<method>.py, its name in `dpcore.names.Method`, its `RunConfig` section, and one entry here
(`register`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpcore.config import RunConfig
from dpcore.data.datasets import LoadedDataset
from dpcore.errors import ConfigError
from dpcore.names import METHODS, PREDICTION_METHODS
from dpcore.privacy.plan import PrivacyPlan
from tasks import adadpsyn as adadpsyn_stage
from tasks import dp_icl as dp_icl_stage
from tasks import dp_opt as dp_opt_stage

Planner = Callable[[RunConfig, LoadedDataset, float], tuple[PrivacyPlan, ...]]


@dataclass(frozen=True)
class MethodEntry:
    """One private-prompting method's part of the protocol (module docstring)."""

    name: str
    title: str
    config_prefix: str
    plan: Planner | None
    subflow: str | None
    artifacts: tuple[str, ...]
    release: bool
    results: str | None = None


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


def registered_plans(config: RunConfig, data: LoadedDataset, delta: float, methods) -> dict[str, tuple]:
    """{method: its plans} for every method of `methods` the registry plans (`MethodEntry.plan`)."""
    return {name: entry(name).plan(config, data, delta) for name in methods if entry(name).plan is not None}


register(MethodEntry("tang", "DP few-shot generation (Tang et al. 2024, Algorithm 1)", "", None, "flows.tang:TANG",
                     ("demos.parquet",), True))
register(MethodEntry("pate", "PromptPATE (Duan et al. 2023, Section 4.2)", "pate_", None, "flows.pate:PATE",
                     ("pate_students.parquet",), True, "pate_results.parquet"))
register(MethodEntry("dpsgd", "PromptDPSGD (Duan et al. 2023, Section 4.1)", "dpsgd_", None, "flows.tune:DPSGD",
                     ("prompts/dpsgd-*.safetensors",), True, "dpsgd_results.parquet"))
register(MethodEntry("adadpsyn", "AdaDPSyn (Gao et al. 2024): DP demonstrations by data-adaptive aggregation",
                     "adadpsyn_", adadpsyn_stage.plans, "flows.adadpsyn:ADADPSYN",
                     ("adadpsyn_demos_eps*.parquet",), False, "adadpsyn_results.parquet"))
register(MethodEntry("dp-opt", "DP-OPT (Hong et al. 2024): a private instruction", "dp_opt_", dp_opt_stage.plans,
                     "flows.dp_opt:DP_OPT", (dp_opt_stage.INSTRUCTION_FILE.format("*"),), False,
                     "dp_opt_results.parquet"))
register(MethodEntry(name="dp-icl", title="DP-ICL (Wu et al. 2024): private prediction by a noisy vote of exemplar "
                     "subsets", config_prefix="dp_icl_", plan=dp_icl_stage.plans, subflow="flows.dp_icl:DP_ICL",
                     artifacts=(dp_icl_stage.ANSWERS_FILE.format("*"),), release=False,
                     results=dp_icl_stage.RESULTS_FILE))
