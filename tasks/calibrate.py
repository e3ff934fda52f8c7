"""Stage 3: DP few-shot generation's privacy plan (`dpcore.fewshot.plan`): sigma for each requested epsilon.

One sigma per epsilon for the whole run, calibrated at the largest per-label sampling
rate q = MN/|D_y| (labels are disjoint, so the run's epsilon is the maximum over labels:
parallel composition). T = max_tokens x demos per label. Epsilon 0 means instruction-only
demos (no private data, sigma unused); epsilon = inf means sigma = 0 (no noise).

The run's `FewShotPlan` is made once, with the rest of the run's plan (`tasks.tang.method_plan`, from
`plan_arguments`, called by `tasks.run_plans.build_run_plan`); its `calibrations` are the rows of the public `calibration` table
(`dpcore.fewshot.plan.CALIBRATION_COLUMNS`), said and written by the `calibrate` task
(`record_calibrations`), and its `privacy_plans()` what the run charges.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from dpcore.config import RunConfig, demos_per_label
from dpcore.data.artifacts import write_table
from dpcore.display import fmt_delta, fmt_eps, fmt_sigma, steps_text
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import CALIBRATION_COLUMNS, FewShotPlan
from tasks.common import stage_logger, uncached_task

__all__ = ["CALIBRATION_COLUMNS", "generation_config", "log_calibrations", "plan_arguments", "record_calibrations"]


def generation_config(config: RunConfig, num_labels: int) -> GenerationConfig:
    """Algorithm 1's parameters for a run: `demos_per_label(shots, labels)` demos of each label."""
    return config.generation_config().model_copy(update={"demos_per_label": demos_per_label(config.shots, num_labels)})


def plan_arguments(config: RunConfig, label_counts: Mapping[str, int], delta: float) -> dict:
    """The keyword arguments of `dpcore.fewshot.plan.fewshot_plan` for a run."""
    return {"epsilons": sorted({float(e) for e in config.epsilons}), "label_counts": dict(label_counts),
            "generation": generation_config(config, len(label_counts)), "delta": float(delta),
            "baselines": list(config.baselines), "audit_reference": bool(config.audit.enabled and config.audit.reference)}


@uncached_task("calibrate")
def record_calibrations(*, plan: FewShotPlan, generation: GenerationConfig, public_dir: str) -> str:
    """The run's sigma per epsilon, as planned (`tasks.tang.TangPlan.fewshot`): said in the log and written
    to the public `calibration` table. Returns its path."""
    log_calibrations(plan, generation)
    frame = pd.DataFrame([c.row() for c in plan.calibrations], columns=CALIBRATION_COLUMNS)
    return str(write_table(frame, Path(public_dir) / "calibration.parquet"))


def log_calibrations(plan: FewShotPlan, generation: GenerationConfig) -> None:
    """One log line per epsilon of the run's `FewShotPlan` (public: parameters and accountant aggregates)."""
    logger = stage_logger()
    for row in plan.calibrations:
        logger.info("epsilon %s: sigma %s (q %.3g, %s, delta %s, accountant upper %s, cross-check %s)",
                    fmt_eps(row.epsilon), fmt_sigma(row.noise_multiplier), row.sampling_rate,
                    steps_text(row.steps, generation.max_tokens), fmt_delta(row.delta), fmt_eps(row.epsilon_upper),
                    "agreed" if row.crosscheck_agreed else "DISAGREED")
