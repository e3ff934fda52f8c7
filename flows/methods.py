"""The flow side of the method registry (`tasks.methods`): a method's subflow found by its entry point, and the
stages every registered prompt-producing method shares after its artifact is made.

`subflow(name)` resolves `MethodEntry.subflow` (`"module:function"`) here, in the flow layer, so the registry
(a tasks module, read by run planning) never imports a flow. `evaluated_rows` is the common tail of a
registered method's subflow: each artifact evaluated on the run's test items (`tasks.evaluate.evaluate`, the
task every method's prompt is scored by), one public results row per plan, the method's results table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from dpcore.data.artifacts import write_table
from dpcore.public_outputs import Kind, declare
from tasks import evaluate as evaluate_stage
from tasks.methods import entry

# A registered method's summary in `dpicl run --json` (`method_summaries/<method>`): its rows' accuracies are DP
# outputs (accuracies of a DP prompt on test items), its sigma and q follow from public counts (|D_y|, n).
declare("json:run", Kind.COUNT, "/method_summaries/*/results/*/noise_multiplier",
        "/method_summaries/*/results/*/sampling_rate")


def subflow(name: str) -> Callable[..., dict]:
    """The subflow of registered method `name` (`MethodEntry.subflow`, imported on first use)."""
    point = entry(name).subflow
    if point is None:
        raise ValueError(f"methods: {name!r} runs inline in the pipeline, it has no subflow")
    module, _, function = point.partition(":")
    return getattr(importlib.import_module(module), function)


def evaluated_rows(name: str, config, ingested: dict, plans: list, artifacts: list[dict]) -> list[dict]:
    """Evaluate each artifact ({epsilon, path, key}) as method `name`'s prompt on the run's test items and write
    the method's public results table (`MethodEntry.results`); its rows (`tasks.evaluate.plan_rows`)."""
    labels = list(ingested["labels"])
    evaluations = [evaluate_stage.evaluate(**evaluate_stage.evaluate_call(
        evaluate_stage.DemoSet(method=name, epsilon=a["epsilon"], demo_paths=(a["path"],), demo_keys=(a["key"],)),
        ingested, config, labels)) for a in artifacts]
    rows = evaluate_stage.plan_rows(plans, evaluations)
    table = entry(name).results
    if table:
        write_table(pd.DataFrame(rows), Path(ingested["paths"]["public"]) / table)
    return rows
