"""Stage 3: the noise multiplier sigma for each requested epsilon (`dpcore.accounting`).

One sigma per epsilon for the whole run, calibrated at the largest per-label sampling
rate q = MN/|D_y| (labels are disjoint, so the run's epsilon is the maximum over labels:
parallel composition). T = max_tokens x demos per label. Epsilon 0 means instruction-only
demos (no private data, sigma unused); epsilon = inf means sigma = 0 (no noise).

The `calibration` table: one row per requested epsilon. `epsilon` is the requested bound
(the guarantee the run claims), `epsilon_upper` the accountant's upper bound at the chosen
sigma (at most `epsilon`), with lower bound, estimate and the dp-accounting cross-check.
"""

from __future__ import annotations

import math

from prefect import get_run_logger, task

from tasks.common import RETRIES, RETRY_DELAY_SECONDS, cache_key_on, transient_only

CALIBRATION_COLUMNS = [
    "epsilon", "method", "mechanism", "noise_multiplier", "sampling_rate", "steps", "delta", "epsilon_upper",
    "epsilon_lower", "epsilon_estimate", "epsilon_crosscheck", "crosscheck_agreed", "num_subsets", "subset_size",
    "warnings",
]
CALIBRATE_KEY_FIELDS = ("epsilons", "label_counts", "num_subsets", "subset_size", "steps", "delta", "mechanism")


def _report_fields(report) -> dict:
    if report is None:
        return {}
    get = (lambda name: report.get(name)) if isinstance(report, dict) else (lambda name: getattr(report, name, None))
    fields = {
        "noise_multiplier": get("noise_multiplier"),
        "sampling_rate": get("sampling_rate"),
        "steps": get("steps"),
        "delta": get("delta"),
        "epsilon_upper": get("epsilon"),
        "epsilon_lower": get("epsilon_lower"),
        "epsilon_estimate": get("epsilon_estimate"),
        "epsilon_crosscheck": get("epsilon_crosscheck"),
        "crosscheck_agreed": get("crosscheck_agreed"),
        "warnings": "\n".join(get("warnings") or ()),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _run_fields(calibrated: dict) -> dict:
    """Row fields from `calibrate_for_labels`: the run-level report (the label with the largest q),
    with the run's cross-check verdict and warnings over all labels."""
    fields = _report_fields(calibrated["report"])
    fields.update(noise_multiplier=calibrated["noise_multiplier"], epsilon_upper=calibrated["epsilon"],
                  sampling_rate=calibrated["sampling_rate"], crosscheck_agreed=calibrated["crosscheck_agreed"],
                  warnings="\n".join(calibrated.get("warnings") or ()))
    return fields


@task(name="calibrate", cache_key_fn=cache_key_on("calibrate", CALIBRATE_KEY_FIELDS, ("dpcore.accounting",)),
      persist_result=True, result_serializer="json", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_SECONDS,
      retry_condition_fn=transient_only)
def calibrate(*, epsilons: list[float], label_counts: dict[str, int], num_subsets: int, subset_size: int,
              steps: int, delta: float, mechanism: str = "gaussian") -> list[dict]:
    """Rows of the `calibration` table (public aggregates)."""
    from dpcore import accounting

    logger = get_run_logger()
    q = max(accounting.sampling_rate(num_subsets, subset_size, count) for count in label_counts.values())
    rows = []
    for eps in sorted(set(float(e) for e in epsilons)):
        row = {"epsilon": eps, "mechanism": mechanism, "num_subsets": num_subsets, "subset_size": subset_size,
               "sampling_rate": q, "steps": steps, "delta": delta, "crosscheck_agreed": True, "warnings": ""}
        if eps == 0:
            row.update(method="instruction-only", noise_multiplier=0.0, sampling_rate=0.0, epsilon_upper=0.0,
                       epsilon_lower=0.0, epsilon_estimate=0.0, epsilon_crosscheck=0.0)
        elif math.isinf(eps):
            report = accounting.epsilon_for(0.0, q, steps, delta, mechanism=mechanism)
            row.update(method="sigma-zero", **_report_fields(report))
            row.update(noise_multiplier=0.0, epsilon_upper=math.inf)
        else:
            calibrated = accounting.calibrate_for_labels(eps, label_counts, num_subsets, subset_size, steps, delta,
                                                         mechanism=mechanism)
            row.update(method="dp", **_run_fields(calibrated))
        row["epsilon"] = eps
        rows.append({name: row.get(name) for name in CALIBRATION_COLUMNS})
        logger.info("epsilon %s: sigma %.4f (q=%.3g, T=%d, delta=%.3g, accountant upper %s, cross-check %s)",
                    "inf" if math.isinf(eps) else f"{eps:g}", row["noise_multiplier"], row["sampling_rate"], steps,
                    delta, row.get("epsilon_upper"), "agreed" if row.get("crosscheck_agreed") else "DISAGREED")
    return rows
