"""Plots of a run's public results (matplotlib's object API on the Agg canvas: no display, no pyplot state).

`privacy_utility_curve`: ICL accuracy of the DP demonstrations against epsilon, with the
baselines of Tang et al. Table 1 as horizontal lines (0-shot, epsilon = 0 instruction-only
demos, epsilon = infinity (a) sigma = 0 demos and (b) random real demos). Input: the public
`metrics` table (method, epsilon, seed, accuracy, calibrated_accuracy).

`roc_plot`: the membership audit's pooled ROC curves (`dpcore.audit.statistics.roc_curve`),
one per audit, linear and log-log. Input: `AuditResult`s (scores and member flags, no text);
a plot with a non-private audit's curve belongs in the private store, like its scores.

Nothing private is drawn in the public plots.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.audit.statistics import roc_curve
from dpcore.data.artifacts import write_bytes_atomic
from dpcore.names import current_method_names

BASELINE_STYLES = {
    "zero-shot": ("0-shot", "tab:gray", ":"),
    "instruction-only": ("eps=0 (instruction-only demos)", "tab:green", "--"),
    "sigma-zero": ("eps=inf (a) sigma=0", "tab:red", "--"),
    "random-real": ("eps=inf (b) random real demos", "tab:purple", "-."),
}


def accuracy_summary(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation (ddof=0, as `dpcore.report.summary.summarise_metrics`) over seeds per (method, epsilon)."""
    rows = []
    metrics = current_method_names(metrics)  # a table written before tang was named so says dp
    for (method, epsilon), group in metrics.groupby(["method", "epsilon"], dropna=False, sort=True):
        row = {"method": method, "epsilon": float(epsilon), "seeds": len(group)}
        for column in ("accuracy", "calibrated_accuracy"):
            if column in group.columns:
                values = group[column].to_numpy(dtype=float)
                row[f"{column}_mean"] = float(np.mean(values))
                row[f"{column}_std"] = float(np.std(values))
        rows.append(row)
    return pd.DataFrame(rows)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return write_bytes_atomic(Path(path), buffer.getvalue())


def privacy_utility_curve(metrics: pd.DataFrame, path: Path, title: str = "", calibrated: bool = True) -> Path:
    """Accuracy (mean +/- std over seeds) of DP demos against epsilon (log axis), baselines as horizontal lines."""
    from matplotlib.ticker import FixedLocator, NullLocator

    summary = accuracy_summary(metrics)
    column = "calibrated_accuracy" if calibrated and "calibrated_accuracy_mean" in summary else "accuracy"
    figure = _figure(6.4, 4.2)
    axis = figure.subplots()
    if len(summary):
        dp = summary[(summary["method"] == "tang") & summary["epsilon"].map(lambda e: 0 < e < math.inf)]
        dp = dp.sort_values("epsilon")
    else:
        dp = summary
    if len(dp):
        axis.errorbar(dp["epsilon"], dp[f"{column}_mean"], yerr=dp[f"{column}_std"], marker="o", capsize=3,
                      color="tab:blue", label="DP demos (Algorithm 1)")
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_locator(FixedLocator(list(dp["epsilon"])))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xticklabels([f"{e:g}" for e in dp["epsilon"]])
    for method, (label, color, style) in BASELINE_STYLES.items():
        rows = summary[summary["method"] == method] if len(summary) else summary
        if len(rows):
            value = float(rows[f"{column}_mean"].iloc[0])
            axis.axhline(value, color=color, linestyle=style, label=f"{label}: {value:.3f}")
    axis.set_xlabel("epsilon (log scale)")
    axis.set_ylabel("calibrated accuracy" if column == "calibrated_accuracy" else "accuracy")
    axis.set_ylim(0.0, 1.0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    axis.set_title(title or "Privacy-utility trade-off")
    return _save(figure, path)


# One colour and marker per method, in the order the methods are drawn (the caller's, or the table's).
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def comparison_curve(table: pd.DataFrame, path: Path, title: str = "", calibrated: bool = True,
                     labels: dict[str, str] | None = None) -> Path:
    """Accuracy against epsilon (log axis), a line per private-prompting method (`summary.comparison_table`),
    the references (zero-shot, non-private rows) as horizontal lines. `labels`: each method's legend label, in
    drawing order (the method registry's titles); a method of the table it does not name is drawn under its own
    name after them."""
    column = "calibrated_accuracy" if calibrated else "accuracy"
    figure = _figure(6.4, 4.2)
    axis = figure.subplots()
    finite = table[table["epsilon"].map(lambda e: 0 < e < math.inf)] if len(table) else table
    ticks = sorted({float(e) for e in finite["epsilon"]}) if len(finite) else []
    labels = dict(labels or {})
    for method in (finite["method"].drop_duplicates().tolist() if len(finite) else []):
        labels.setdefault(method, method)
    for place, (method, label) in enumerate(labels.items()):
        rows = finite[finite["method"] == method].sort_values("epsilon") if len(finite) else finite
        rows = rows[rows[f"{column}_mean"].notna()] if len(rows) else rows
        if len(rows):
            axis.errorbar(rows["epsilon"], rows[f"{column}_mean"], yerr=rows[f"{column}_std"].fillna(0.0),
                          marker=_MARKERS[place % len(_MARKERS)], capsize=3, color=_COLORS[place % len(_COLORS)],
                          label=label)
    if ticks:
        from matplotlib.ticker import FixedLocator, NullLocator

        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_locator(FixedLocator(ticks))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xticklabels([f"{e:g}" for e in ticks])
    styles = [":", "--", "-.", (0, (1, 3)), (0, (5, 5))]
    references = table[~table["epsilon"].map(lambda e: 0 < e < math.inf) & table[f"{column}_mean"].notna()] \
        if len(table) else table
    for i, row in enumerate(references.to_dict(orient="records")):
        name = row["method"] + ("" if row["method"] == "zero-shot" else f" (epsilon {row['epsilon']:g})")
        value = float(row[f"{column}_mean"])
        axis.axhline(value, color="gray", linestyle=styles[i % len(styles)], label=f"{name}: {value:.3f}")
    axis.set_xlabel("epsilon (log scale)")
    axis.set_ylabel("calibrated accuracy" if calibrated else "accuracy")
    axis.set_ylim(0.0, 1.0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")
    axis.set_title(title or "Private prompts compared")
    return _save(figure, path)


def roc_plot(results: Sequence, path: Path, title: str = "") -> Path:
    """Pooled ROC curves (members vs non-members), one per audit (e.g. DP vs non-private), as a PNG.

    `results`: `dpcore.audit.procedures.AuditResult`s; each draws its strongest attack's scores. Left: linear
    axes with the chance diagonal; right: log-log axes for the low-FPR region. Written atomically.
    """
    figure = _figure(9.6, 4.4)
    linear, logarithmic = figure.subplots(1, 2)
    floor = 1.0
    for result in results:
        scores = result.mia_scores
        if "attack" in scores.columns:  # the gate's attack (the strongest) of each audit
            scores = scores.loc[scores["attack"] == result.attack]
        member = scores["member"].to_numpy(dtype=bool)
        if member.all() or not member.any():
            continue
        values = scores["score"].to_numpy(dtype=float)
        curve = roc_curve(values[member], values[~member])
        name = result.setting if result.setting == "non-private" else f"{result.setting} eps={result.epsilon:g}"
        label = f"{name} [{result.attack}]: mean trial AUC {result.auc:.3f} (pooled {result.pooled_auc:.3f})"
        for axis in (linear, logarithmic):
            axis.plot(curve.fpr, curve.tpr, drawstyle="steps-post", label=label)
        floor = min(floor, 1.0 / curve.non_members, 1.0 / curve.members)
    grid = np.linspace(0, 1, 101)
    linear.plot(grid, grid, color="gray", linestyle=":", label="chance")
    logarithmic.plot(np.maximum(grid, floor / 2), np.maximum(grid, floor / 2), color="gray", linestyle=":")
    linear.set(xlim=(0, 1), ylim=(0, 1), xlabel="false positive rate (non-members)",
               ylabel="true positive rate (members)", title=title or "Membership inference ROC (pooled)")
    logarithmic.set(xscale="log", yscale="log", xlim=(floor / 2, 1), ylim=(floor / 2, 1.05),
                    xlabel="false positive rate (log)", ylabel="true positive rate (log)", title="low-FPR region")
    for axis in (linear, logarithmic):
        axis.grid(True, alpha=0.3)
    linear.legend(fontsize=8, loc="lower right")
    return _save(figure, path)
