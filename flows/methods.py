"""The flow side of the method registry (`tasks.methods`): a method's subflow found by its entry point, and the
stages every registered prompt-producing method shares after its artifact is made.

`method_flow(name)` resolves `MethodEntry.subflow` (`"module:NAME"`, a `MethodFlow`) here, in the flow layer, so
the registry (a tasks module, read by run planning) never imports a flow. `evaluated_rows` is the common tail of a
registered method's subflow: each artifact evaluated on the run's test items (`tasks.evaluate.evaluate`, the
task every method's prompt is scored by), one public results row per plan, the method's results table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dpcore.data.artifacts import write_json_atomic, write_table
from dpcore.home import configure_environment
from dpcore.public_outputs import Kind, declare
from flows.runner import default_run_id
from tasks import evaluate as evaluate_stage
from tasks import ingest as ingest_stage
from tasks.charge import charge_plans, noise_charged
from tasks.common import Ingested
from tasks.methods import REGISTRY, entry
from tasks.run_plans import build_run_plan

# A registered method's summary in `dpicl run --json` (`method_summaries/<method>`): its rows' accuracies are DP
# outputs (accuracies of a DP prompt on test items), its sigma and q follow from public counts (|D_y|, n).
declare("json:run", Kind.COUNT, "/method_summaries/*/results/*/noise_multiplier",
        "/method_summaries/*/results/*/sampling_rate")
# A registered method's plan file (`ReleaseSpec.plan_file` of a method the registry plans): its plans follow from
# public counts (sigma, q, the accountant's epsilons, n); the records' keyed content hash is an identity.
for _entry in REGISTRY.values():
    if _entry.plan is not None and _entry.release_spec is not None and _entry.release_spec.plan_file:
        declare(f"file:*{_entry.release_spec.plan_file}", Kind.COUNT, "/plans/**")
        declare(f"file:*{_entry.release_spec.plan_file}", Kind.IDENTITY, "/data_hash")


@dataclass(frozen=True)
class MethodFlow:
    """What the pipeline runs of one method (the flow side of `tasks.methods.MethodEntry`):

    - `run(config=, run_id=, ingested=, charge=, plan=, prepared=) -> dict`: its stages or subflow on the run's
      one charge; a public summary with `results` (rows: method, epsilon, delta, accuracies, n) and
      `seeded_noise`;
    - `prepare(config, plan, ingested) -> prepared`: what must run before the charge (checks that could
      otherwise fail after it; tables of the plan), or None;
    - `mark_charged(config, run_id, ingested, plan, charge)`: right after the charge, the stages it covers
      marked (a run stopped before they began runs them once when resumed), or None."""

    run: Callable[..., dict]
    prepare: Callable[..., Any] | None = None
    mark_charged: Callable[..., None] | None = None


def method_flow(name: str) -> MethodFlow:
    """The `MethodFlow` of registered method `name` (`MethodEntry.subflow`, `"module:NAME"`, imported on
    first use: the registry, a tasks module, names it and never imports a flow)."""
    point = entry(name).subflow
    if point is None:
        raise ValueError(f"methods: {name!r} has no flow registered")
    module, _, attribute = point.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if not isinstance(found, MethodFlow):
        raise TypeError(f"methods: {point} is not a MethodFlow")
    return found


def evaluated_rows(name: str, config, ingested: Ingested, plans: list, artifacts: list[dict]) -> list[dict]:
    """Evaluate each artifact ({epsilon, path, key, seeded_noise}) as method `name`'s prompt on the run's test
    items and write the method's public results table (`MethodEntry.results`) and its plan file
    (`ReleaseSpec.plan_file`: its plans as charged, the run's model, data identity and task spec, whether the noise
    was seeded: what a release reads, `dpcore.release.planned.load_planned_artifact`); its rows
    (`tasks.evaluate.plan_rows`)."""
    write_json_atomic(ingested.paths.public / entry(name).release_spec.plan_file, {
        "method": name, "plans": [p.to_dict() for p in plans],
        "seeded_noise": any(bool(a.get("seeded_noise")) for a in artifacts), "model": config.model,
        "dataset": config.dataset, "dataset_id": config.ledger_id, "data_hash": ingested.data_hash,
        "task_spec": ingested.task_spec})
    labels = list(ingested.labels)
    evaluations = [evaluate_stage.evaluate(**evaluate_stage.evaluate_call(
        evaluate_stage.DemoSet(method=name, epsilon=a["epsilon"], demo_paths=(a["path"],), demo_keys=(a["key"],)),
        ingested, config, labels)) for a in artifacts]
    rows = evaluate_stage.plan_rows(plans, evaluations)
    table = entry(name).results
    if table:
        write_table(pd.DataFrame(rows), ingested.paths.public / table)
    return rows


def planned_and_charged(name: str, *, config, run_id: str | None, ingested: Ingested | None, charge: dict | None,
                        plan, before_charge: Callable[[list], None] | None = None) -> tuple:
    """A registered method's subflow's start: (run_id, the run's plan, ingested, its plans, the charge). As a
    subflow, the pipeline's plan, ingested data and charge; alone, it plans (dry-run first), ingests and charges
    here (`before_charge(plans)` just before)."""
    configure_environment()
    run_id = run_id or default_run_id()
    if plan is None or name not in plan.method_plans:
        plan = build_run_plan(config, methods=(name,))
        plan.dry_run(run_id)
    ingested = ingest_stage.ingested_for(plan, run_id, ingested, name)
    plans = list(plan.method_plans[name])
    if charge is None:
        if before_charge is not None:
            before_charge(plans)
        charge = charge_plans(plan.config.ledger_id, ingested.data_hash, run_id, plans,
                              same_records_ok=plan.config.new_budget_for_same_records)
    return run_id, plan, ingested, plans, charge


# What a prompt-making method makes of one of its plans: (the run's plan, the ingested data, the plan, whether this
# attempt charged its noise) -> its artifact {epsilon, path, key, seeded_noise} (its stage in `tasks/<method>.py`).
MakeArtifact = Callable[[Any, Ingested, Any, bool], dict]


def artifacts_evaluated(name: str, make: MakeArtifact, *, config, run_id: str | None, ingested: Ingested | None,
                        charge: dict | None, plan) -> dict:
    """The body a registered prompt-making method's subflow shares (every method the registry plans): its plans (the run's, or
    planned here when it runs alone: dry-run, then charged here), its artifact per plan (`make`, on the charge),
    each evaluated on the run's test items (`evaluated_rows`); the public summary {method, results, seeded_noise,
    artifacts, run_dir}."""
    run_id, plan, ingested, plans, charge = planned_and_charged(name, config=config, run_id=run_id,
                                                                ingested=ingested, charge=charge, plan=plan)
    made = [make(plan, ingested, p, noise_charged(charge, name, p.epsilon)) for p in plans]
    rows = evaluated_rows(name, plan.config, ingested, plans, made)
    return {"method": name, "results": rows, "seeded_noise": any(m["seeded_noise"] for m in made),
            "artifacts": [m["path"] for m in made], "run_dir": str(ingested.paths.public)}
