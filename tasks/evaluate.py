"""Stage 5: ICL evaluation of every method through `dpcore.lm.icl.evaluate`.

One task per (method, epsilon) (`DemoSet`s of `evaluation_plan`): 0-shot, instruction-only demos
(epsilon = 0), sigma = 0 demos and random real demos (epsilon = infinity (a) and (b)), and the DP
demos at each epsilon. Outputs: `metrics` (public: accuracies aggregated per method, epsilon and
seed) and `predictions` (PRIVATE: each test item's id, gold label and label probabilities are
per-record functions of the test split, which comes from the private data; private stage folder).
`evaluate_pool` is the evaluation itself, shared with `dpicl evaluate` (`flows.standalone`): the
random-real baseline's real demonstrations stay private there and here alike: the ids of the
chosen records go to the private `real_demos` table and are blanked in `predictions`, and an
extraction task's answers (which may copy the real records' words) are blanked too.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict

from dpcore.data.artifacts import read_table, write_table
from dpcore.display import fmt_eps
from dpcore.fewshot.plan import RANDOM_REAL
from dpcore.lm.config import EvalConfig
from dpcore.public_outputs import Kind, declare, declare_log
from dpcore.release.planned import read_instruction
from dpcore.release.spec import INSTRUCTION, TRAINED_PROMPT
from tasks.common import Ingested, cached_task, open_stage, report_progress, stage_dir, stage_logger

EVAL_MODULES = ("dpcore.lm.icl", "dpcore.lm.prefix_cache", "dpcore.data.taskspec", "dpcore.lm.model", "dpcore.dpsgd.soft_prompt",
                "dpcore.dpsgd.adapters", "dpcore.release.planned")
EVALUATE_KEY_FIELDS = ("data_hash", "task_spec", "method", "epsilon", "demo_keys", "eval_config", "labels",
                       "model", "dtype")
ZERO_SHOT = "zero-shot"
# An evaluation's public outputs: accuracies of a DP prompt on test items (DP post-processing); the epsilon its
# method was charged (public counts, or PromptPATE's DP-released bound); the time spent scoring the test items
# (public work: no private record is read, whatever the method).
for _output in ("file:cache/stages/evaluate/*/metrics.parquet", "file:*/metrics.parquet"):
    declare(_output, Kind.DP, "/*/accuracy", "/*/calibrated_accuracy", "/*/epsilon")
    declare(_output, Kind.PUBLIC_TIMING, "/*/seconds")
declare("file:cache/stages/evaluate/*/prefect-result.json", Kind.DP, "/result/metrics/*/accuracy",
        "/result/metrics/*/calibrated_accuracy", "/result/epsilon")
declare("file:cache/stages/evaluate/*/prefect-result.json", Kind.PUBLIC_TIMING, "/result/seconds")
EVALUATED_LOG = declare_log("evaluated %s at epsilon %s: accuracy %.3f, calibrated %.3f (mean over %d seeds, n=%d) "
                            "in %d s", dp=(1, 2, 3), public_timing=(6,))
# What a method's demo set holds, by its release kind (`tasks.methods.release_kind`): demonstrations, demo_paths =
# their tables; a trained prompt, demo_paths = [its or its adapter's safetensors]; an instruction, demo_paths = [its
# JSON ({"instruction": ...})]; demo_keys = their sha256. What the prompt then holds (`dpcore.lm.icl.PromptContent`):
PROMPT_CONTENT = {TRAINED_PROMPT: "none", INSTRUCTION: "instruction"}


class DemoSet(BaseModel):
    """What one evaluation task scores: a method at one epsilon and its demos (paths and cache keys)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    method: str
    epsilon: float
    demo_paths: tuple[str, ...] = ()
    demo_keys: tuple[str, ...] = ()


def evaluate_pool(lm, spec, test: pd.DataFrame, pool, method: str, epsilon: float, eval_config: EvalConfig,
                  labels: list[str] | None, *, past=None, batch_size: int = 16, max_new_tokens: int = 12,
                  remote=None, content: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(predictions, metrics, the random-real baseline's private demo ids or None) of one method.

    Predictions and demo ids are private (per-record functions of the data); metrics are aggregates.
    `remote` (`dpcore.release.endpoint.Scorers`, from `endpoint_scorers`): score through a server instead of `lm`.
    `content`: what the prompt holds besides the query (`dpcore.lm.icl.PromptContent`; None: by the method)."""
    from dpcore.lm import icl

    what = f"evaluate {method} eps={'inf' if math.isinf(epsilon) else f'{epsilon:g}'}: test items"
    predictions, metrics = icl.evaluate(lm, spec, test, pool, method, epsilon, eval_config,
                                        labels=labels if spec.kind == "classification" else None,
                                        batch_size=batch_size, max_new_tokens=max_new_tokens,
                                        items_progress=lambda done, total: report_progress(what, done, total),
                                        past=past, score=remote.score if remote else None,
                                        answer=remote.answer if remote else None, content=content)
    real = None
    if method == RANDOM_REAL:
        predictions, real = icl.split_private_demo_ids(predictions, free_text=spec.kind != "classification")
    return predictions, metrics, real


def endpoint_scorers(endpoint, known_model: str | None, spec, labels: list[str] | None):
    """(the connected `dpcore.release.endpoint.Endpoint`, its `Scorers` for `spec`): the server's model list read and
    its scoring mode probed (content-free queries only), so a server that is down fails here, in one line."""
    from dpcore.release import endpoint as remote

    connection = remote.connect(endpoint, known_model=known_model)
    return connection, remote.scorers(connection, spec, labels or [])


@cached_task("evaluate", EVALUATE_KEY_FIELDS, EVAL_MODULES, private_outputs=True,
             task_run_name="evaluate-{method}-eps{epsilon:g}")
def evaluate(
    *,
    records_path: str,
    data_hash: str,
    task_spec: str,
    method: str,
    epsilon: float,
    demo_paths: list[str],
    demo_keys: list[str],
    eval_config: EvalConfig,
    labels: list[str],
    model: str,
    device: str = "auto",
    dtype: str = "auto",
) -> dict:
    """Evaluate one method; returns the stage paths and its per-seed metrics (aggregates)."""
    from tasks.ingest import private_split
    from tasks.methods import release_kind  # the registry imports every method's stages (torch)

    key, spec, lm = open_stage("evaluate", locals(), EVALUATE_KEY_FIELDS, EVAL_MODULES, task_spec=task_spec,
                               model=model, device=device, dtype=dtype)
    test = private_split(records_path, "test")
    past = None
    kind = release_kind(method)  # None: a baseline
    if method == ZERO_SHOT:
        pool = None
    elif kind == TRAINED_PROMPT:  # a trained prompt: its cache before every prompt, no demos; or the adapted model
        from dpcore.dpsgd.adapters import trained_scoring

        pool = None
        lm, past = trained_scoring(lm, demo_paths[0])
    elif kind == INSTRUCTION:  # a private instruction in front of a zero-shot prompt (post-processing)
        from dpcore.lm.icl import with_instruction

        pool = None
        spec = with_instruction(spec, read_instruction(Path(demo_paths[0])))
    elif method == RANDOM_REAL:
        pool = private_split(records_path, "train")
    else:
        frames = [read_table(Path(p)) for p in demo_paths]
        pool = pd.concat(frames, ignore_index=True)[["text", "label"]] if frames else None
    began = time.perf_counter()
    predictions, metrics, real = evaluate_pool(lm, spec, test, pool, method, epsilon, eval_config, labels, past=past,
                                               content=PROMPT_CONTENT.get(kind, kind))
    seconds = time.perf_counter() - began
    out = stage_dir("evaluate", key)
    private_out = stage_dir("evaluate", key, private=True)
    # the task's result is persisted in the public stage folder: whole seconds only (a timing of test records)
    result = {"key": key, "method": method, "epsilon": float(epsilon), "seconds": round(seconds)}
    if real is not None:
        result["real_demos_path"] = str(write_table(real, private_out / "real_demos.parquet"))
    result["predictions_path"] = str(write_table(predictions, private_out / "predictions.parquet"))
    result["metrics_path"] = str(write_table(metrics, out / "metrics.parquet"))
    result["metrics"] = metrics[["seed", "n", "accuracy", "calibrated_accuracy"]].to_dict(orient="records")
    stage_logger().info(
        EVALUATED_LOG,
        method, fmt_eps(epsilon), metrics["accuracy"].mean(),
        metrics["calibrated_accuracy"].mean(), len(metrics), int(metrics["n"].max()), round(seconds),
    )
    return result


def evaluation_plan(baselines: list[str], generated) -> list[DemoSet]:
    """One evaluation per (method, epsilon): the requested baselines and every generated demo set
    (`tasks.generate.Shard`s, grouped by method and epsilon, labels in order)."""
    plan: list[DemoSet] = []
    if ZERO_SHOT in baselines:
        plan.append(DemoSet(method=ZERO_SHOT, epsilon=0.0))
    groups: dict[tuple[str, float], list] = {}
    for shard in generated:
        groups.setdefault((shard.method, float(shard.epsilon)), []).append(shard)
    for (method, eps), shards in sorted(groups.items()):
        shards = sorted(shards, key=lambda s: s.label)
        plan.append(DemoSet(method=method, epsilon=eps, demo_paths=tuple(s.path for s in shards),
                            demo_keys=tuple(s.key for s in shards)))
    if RANDOM_REAL in baselines:
        plan.append(DemoSet(method=RANDOM_REAL, epsilon=math.inf))
    return plan


def evaluate_call(demo_set: DemoSet, ingested: Ingested, config, labels: list[str]) -> dict:
    """The keyword arguments of the `evaluate` task for one demo set of a pipeline run."""
    return dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                task_spec=ingested.task_spec, method=demo_set.method, epsilon=demo_set.epsilon,
                demo_paths=list(demo_set.demo_paths), demo_keys=list(demo_set.demo_keys),
                eval_config=config.eval_config(), labels=labels, model=config.model, device=config.device,
                dtype=config.dtype)


def plan_rows(plans, evaluations: list[dict]) -> list[dict]:
    """One results row per plan of a registered method (`tasks.methods`): its evaluation's accuracy over seeds
    (mean, std; numpy's ddof 0, as `dpcore.report.summary`), the plan's method, epsilon, delta, sigma and q.
    `evaluations`: `evaluate`'s results, matched to the plans by epsilon. Public rows."""
    by_eps = {float(e["epsilon"]): e for e in evaluations}
    rows = []
    for plan in plans:
        metrics = by_eps[float(plan.epsilon)]["metrics"]
        raw = [float(m["accuracy"]) for m in metrics]
        calibrated = [float(m["calibrated_accuracy"]) for m in metrics]
        rows.append({"method": plan.method, "epsilon": float(plan.epsilon), "delta": float(plan.delta),
                     "noise_multiplier": plan.parameters.get("noise_multiplier"),
                     "sampling_rate": plan.parameters.get("sampling_rate"),
                     "accuracy_mean": statistics.fmean(raw), "accuracy_std": statistics.pstdev(raw),
                     "calibrated_accuracy_mean": statistics.fmean(calibrated),
                     "calibrated_accuracy_std": statistics.pstdev(calibrated),
                     "seeds": len(metrics), "n": int(max(m["n"] for m in metrics))})
    return rows
