"""Summary tables of a finished run: accuracy per (method, epsilon) beside sigma and the audit's figures.

Pure functions over the run's public tables (`metrics`, `calibration`, `audit`): accuracy over seeds
(`summarise_metrics`), the results table (`results_table`), the audit's verdict (`audit_verdict`), the markdown summary shown as
a Prefect artifact (`summary_markdown`), JSON-safe rows (`jsonable_rows`) and whether the private
data paid against calibrated zero-shot (`private_data_verdict`). Aggregates and
public configuration only; no per-record data enters them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpcore.names import METHODS, RAW_SCORED_METHODS, current_method_names, method_name


def finite_or_none(value) -> float | None:
    """`value` as a float when it is a finite number, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def epsilon_text(epsilon: float) -> str:
    """An epsilon as a label: `inf` or the shortest float form."""
    return "inf" if math.isinf(float(epsilon)) else f"{float(epsilon):g}"


def summarise_metrics(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation (over seeds, ddof=0 as numpy) per (method, epsilon)."""
    grouped = metrics.groupby(["method", "epsilon"], sort=False, dropna=False)
    summary = grouped.agg(
        seeds=("seed", "nunique"), n=("n", "max"),
        accuracy_mean=("accuracy", "mean"), accuracy_std=("accuracy", lambda s: float(np.std(s))),
        calibrated_accuracy_mean=("calibrated_accuracy", "mean"),
        calibrated_accuracy_std=("calibrated_accuracy", lambda s: float(np.std(s))),
        seconds=("seconds", "sum"),
    )
    return summary.reset_index()


def results_table(metrics: pd.DataFrame, calibration: pd.DataFrame, audit: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (method, epsilon): accuracy mean/std (raw and calibrated), sigma, and the audit's verdict."""
    summary = summarise_metrics(current_method_names(metrics))
    sigma = {float(r.epsilon): r for r in calibration.itertuples(index=False)}
    rows = []
    for r in summary.itertuples(index=False):
        eps = float(r.epsilon)
        calib = sigma.get(eps) if r.method in ("tang", "sigma-zero", "instruction-only") else None
        row = {
            "method": r.method, "epsilon": eps,
            "noise_multiplier": (float(calib.noise_multiplier) if calib is not None
                                 else 0.0 if r.method == "sigma-zero" else None),
            "accuracy_mean": float(r.accuracy_mean), "accuracy_std": float(r.accuracy_std),
            "calibrated_accuracy_mean": float(r.calibrated_accuracy_mean),
            "calibrated_accuracy_std": float(r.calibrated_accuracy_std),
            "seeds": int(r.seeds), "n": int(r.n),
        }
        row.update(audit_metrics(audit, r.method, eps))
        rows.append(row)
    order = {"zero-shot": 0, "instruction-only": 1, "tang": 2, "sigma-zero": 3, "random-real": 4}
    table = pd.DataFrame(rows)
    if len(table):
        table = table.sort_values(by=["method", "epsilon"], key=lambda s: s.map(order) if s.name == "method" else s)
    return table.reset_index(drop=True)


# The audit's `setting` of a row's prompt: tang's DP demonstrations are audited in the "dp" setting (as every
# DP prompt is, against "non-private"); instruction-only is its own setting.
AUDIT_SETTING = {"tang": "dp"}


def audit_metrics(audit: pd.DataFrame | None, method: str, epsilon: float) -> dict:
    """The public audit verdict (passed | inconclusive | failed) of the row matching (method, epsilon), if
    any: the audit's figures are statistics of private records and stay in the private audit table."""
    if audit is None or not len(audit) or "epsilon" not in audit.columns:
        return {}
    rows = audit[audit["epsilon"].astype(float) == float(epsilon)]
    if "setting" in audit.columns:
        rows = rows[rows["setting"] == AUDIT_SETTING.get(method, method)]
    elif method != "tang":
        return {}
    if not len(rows):
        return {}
    row = rows.iloc[0]
    verdict = row.get("verdict")
    if verdict is None or (isinstance(verdict, float) and math.isnan(verdict)):
        verdict = "passed" if bool(row.get("passed")) else "failed"
    return {"audit": str(verdict)}


def audit_verdict(audit: pd.DataFrame | None) -> dict:
    """Whether the audit ran, whether every row passed, and its reasons (one per line, prefixed by epsilon)."""
    if audit is None or not len(audit):
        return {"ran": False, "passed": None, "reasons": []}
    passed = bool(audit["passed"].astype(bool).all()) if "passed" in audit.columns else None
    reasons: list[str] = []
    if "reasons" in audit.columns:
        for row in audit.to_dict(orient="records"):
            value = row["reasons"]
            lines = ([str(v) for v in value if v] if isinstance(value, list | tuple)
                     else [line for line in str(value or "").splitlines() if line])
            where = f"epsilon {epsilon_text(row['epsilon'])}: " if "epsilon" in row else ""
            reasons.extend(where + line for line in lines)
    return {"ran": True, "passed": passed, "reasons": reasons}


def _fmt(value, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def summary_markdown(info: dict, table: pd.DataFrame, calibration: pd.DataFrame, verdict: dict) -> str:
    """The run's markdown summary: provenance, the privacy table, accuracy per (method, epsilon), the audit."""
    lines = [
        f"# DP few-shot run `{info['run_id']}`",
        "",
        f"- dataset **{info['dataset']}** (content hash `{info['data_hash'][:12]}`), "
        f"{info['num_private_records']} private records, model `{info['model']}`",
        f"- code version `{info['code_version']}`, noise: "
        + ("**fixed seed (experiment, never releasable)**" if info["seeded_noise"] else "cryptographically seeded"),
        f"- run folder `{info['run_dir']}`",
        "",
        "## Privacy",
        "",
        "| epsilon | method | sigma | q | T | delta | accountant upper | cross-check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in calibration.itertuples(index=False):
        lines.append(
            f"| {epsilon_text(r.epsilon)} | {r.method} | {_fmt(r.noise_multiplier, '.4f')} | {_fmt(r.sampling_rate, '.3g')} "
            f"| {r.steps} | {_fmt(r.delta, '.3g')} | {_fmt(r.epsilon_upper, '.3f')} "
            f"| {'agreed' if r.crosscheck_agreed else 'DISAGREED'} |"
        )
    lines += ["", "## Accuracy (mean +/- std over seeds)", "",
              "| method | epsilon | accuracy | calibrated accuracy | audit |", "|---|---|---|---|---|"]
    for r in table.to_dict(orient="records"):
        lines.append(
            f"| {r['method']} | {epsilon_text(r['epsilon'])} | {_fmt(r['accuracy_mean'])} +/- {_fmt(r['accuracy_std'])} "
            f"| {_fmt(r['calibrated_accuracy_mean'])} +/- {_fmt(r['calibrated_accuracy_std'])} "
            f"| {r.get('audit') or '-'} |"
        )
    lines += ["", "## Audit", ""]
    if not verdict["ran"]:
        lines.append("Not run (`--no-audit`); such a run cannot be released.")
    else:
        lines.append(f"**{'PASSED' if verdict['passed'] else 'FAILED'}**")
        lines += [f"- {reason}" for reason in verdict["reasons"]]
    return "\n".join(lines) + "\n"


def jsonable_rows(table: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts: NaN -> None, infinities -> \"inf\", floats rounded to 6 digits."""
    rows = []
    for row in table.to_dict(orient="records"):
        clean = {}
        for key, value in row.items():
            if isinstance(value, float):
                value = None if math.isnan(value) else ("inf" if math.isinf(value) else round(value, 6))
            clean[key] = value
        rows.append(clean)
    return rows


COMPARISON_COLUMNS = ["method", "epsilon", "delta", "noise_multiplier", "accuracy_mean",
                      "accuracy_std", "calibrated_accuracy_mean", "calibrated_accuracy_std", "n", "audit"]


def with_audit_verdict(rows: list[dict], audits: list[dict]) -> list[dict]:
    """`rows` of one method's results with `audit` set on the row each audit ({method, epsilon, verdict})
    names (same method, epsilon within 1e-9 relative)."""
    out = []
    for row in rows:
        found = [a["verdict"] for a in audits if a["method"] == row.get("method") and row.get("epsilon") is not None
                 and math.isclose(float(a["epsilon"]), float(row["epsilon"]), rel_tol=1e-9)]
        out.append({**row, "audit": found[-1]} if found else dict(row))
    return out


def comparison_table(tang_rows: list[dict], method_rows: list[dict], delta: float | None = None) -> pd.DataFrame:
    """One row per (method, epsilon) over the private-prompting methods run on the same test split: DP few-shot
    generation's rows (`tang`, Tang et al., with its baselines), then every other method's (`method_rows`, in the
    registry's order, read from their results tables), beside the references (zero-shot once, the non-private
    baselines). `epsilon` is what the
    ledger charged (PromptPATE's data-dependent bound is a non-DP statistic of the votes and stays in the
    private store). No wall time: each method's depends on its private records (the private run folder
    keeps them)."""
    rows, seen = [], set()
    for source_rows in (tang_rows, method_rows):
        for row in source_rows:
            method = method_name(row["method"])  # rows of an older run may say dp
            epsilon = float(row["epsilon"]) if row.get("epsilon") is not None else math.nan
            key = (method, epsilon)
            if key in seen:  # zero-shot is evaluated by several methods on the same items: listed once
                continue
            seen.add(key)
            row_delta = finite_or_none(row.get("delta"))  # a table read back holds NaN where a row had none
            rows.append({
                "method": method, "epsilon": epsilon,
                "delta": row_delta if row_delta is not None else delta,
                "noise_multiplier": row.get("noise_multiplier"),
                **{k: finite_or_none(row.get(k)) for k in ("accuracy_mean", "accuracy_std",
                                                           "calibrated_accuracy_mean", "calibrated_accuracy_std")},
                "n": int(row["n"]) if finite_or_none(row.get("n")) is not None else None,
                "audit": row.get("audit"),
            })
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def comparison_markdown(run_id: str, table: pd.DataFrame, cost: dict | None = None) -> str:
    """The comparison table as markdown (the Prefect artifact of a multi-method run)."""
    lines = [f"# Private prompts compared, run `{run_id}`", "",
             "| method | epsilon | accuracy | calibrated | audit |",
             "|---|---|---|---|---|"]
    for r in table.to_dict(orient="records"):
        lines.append(f"| {r['method']} | {epsilon_text(r['epsilon'])} | "
                     f"{_fmt(r['accuracy_mean'])} +/- {_fmt(r['accuracy_std'])} | "
                     f"{_fmt(r['calibrated_accuracy_mean'])} +/- {_fmt(r['calibrated_accuracy_std'])} | "
                     f"{r['audit'] or '-'} |")
    if cost:
        lines += ["", f"Planned cost of every method, composed as the ledger composes it: epsilon "
                      f"{_fmt(cost.get('epsilon'), '.4g')} at delta {_fmt(cost.get('delta'), '.3g')}."]
    return "\n".join(lines) + "\n"


def used_accuracy(row: dict) -> tuple[float | None, str]:
    """(accuracy, scoring) of a results row as its prompt is used: raw for a trained prompt
    (`dpcore.names.RAW_SCORED_METHODS`), calibrated otherwise."""
    if method_name(row.get("method")) in RAW_SCORED_METHODS:
        return finite_or_none(row.get("accuracy_mean")), "raw"
    return finite_or_none(row.get("calibrated_accuracy_mean")), "calibrated"


def private_data_verdict(rows: list[dict], epsilons: list | None = None) -> dict | None:
    """Did the private data pay? The best private prompt of each epsilon (accuracy as it is used) against the
    calibrated zero-shot prompt on the same test items: the difference and its standard error
    sqrt(a(1-a)/n + z(1-z)/n) (two binomial proportions over n items; conservative for paired items), and
    `paid` when the difference exceeds two standard errors, `hurt` when it is below minus two, else
    `within noise`. `epsilons`: the run's asked epsilons; a row charged less (PromptPATE stops within its
    target) counts for the smallest asked epsilon it fits. A function of the published accuracies only. None
    without a zero-shot row or a DP row."""
    zero = next((r for r in rows if r.get("method") == "zero-shot"), None)
    z = finite_or_none(zero.get("calibrated_accuracy_mean")) if zero else None
    n = int(zero["n"]) if zero and zero.get("n") else None
    if z is None or not n:
        return None
    asked = sorted(float(e) for e in epsilons or [] if 0 < float(e) < math.inf)
    groups: dict[float, list] = {}
    for r in rows:
        accuracy, scoring = used_accuracy(r)
        epsilon = float(r["epsilon"])
        if method_name(r.get("method")) not in METHODS or accuracy is None or not 0 < epsilon < math.inf:
            continue
        bucket = next((e for e in asked if epsilon <= e * (1 + 1e-6)), None) if asked else epsilon
        if bucket is not None:
            groups.setdefault(bucket, []).append((accuracy, method_name(r["method"]), scoring))
    verdicts = []
    for epsilon in sorted(groups):
        accuracy, method, scoring = max(groups[epsilon])
        difference = accuracy - z
        error = math.sqrt(accuracy * (1 - accuracy) / n + z * (1 - z) / n)
        outcome = "paid" if difference > 2 * error else "hurt" if difference < -2 * error else "within noise"
        verdicts.append({"epsilon": epsilon, "method": method, "scoring": scoring, "accuracy": accuracy,
                         "zero_shot_calibrated": z, "difference": difference, "standard_error": error, "n": n,
                         "verdict": outcome})
    return {"zero_shot_calibrated": z, "n": n, "epsilons": verdicts} if verdicts else None


def verdict_line(verdict: dict | None) -> str | None:
    """One line per epsilon: `private data paid at epsilon 8: dpsgd 0.813 (raw) against calibrated zero-shot
    0.543, +0.270 +/- 0.038 (one standard error, 300 test items)`; paid means by more than two."""
    if not verdict:
        return None
    words = {"paid": "paid", "hurt": "did not pay (worse)", "within noise": "did not clearly pay (within noise)"}
    return "\n".join(
        f"private data {words[v['verdict']]} at epsilon {epsilon_text(v['epsilon'])}: {v['method']} "
        f"{v['accuracy']:.3f} ({v['scoring']}) against calibrated zero-shot {v['zero_shot_calibrated']:.3f}, "
        f"{v['difference']:+.3f} +/- {v['standard_error']:.3f} (one standard error, {v['n']} test items)"
        for v in verdict["epsilons"])
