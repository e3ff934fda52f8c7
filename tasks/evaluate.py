"""Stage 5: ICL evaluation of every method through `dpcore.icl.evaluate`.

One task per (method, epsilon): 0-shot, instruction-only demos (epsilon = 0), sigma = 0
demos and random real demos (epsilon = infinity (a) and (b)), and the DP demos at each
epsilon. Outputs: `metrics` (public: accuracies aggregated per method, epsilon and seed) and
`predictions` (PRIVATE: each test item's id, gold label and label probabilities are per-record
functions of the test split, which comes from the private data; private stage folder). The
random-real baseline's real demonstrations stay private too: the ids of the chosen records go
to the private `real_demos` table and are blanked in `predictions`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task

from dpcore.artifacts import read_table, write_table
from dpcore.config import EvalConfig
from tasks.common import (
    RETRIES,
    RETRY_DELAY_SECONDS,
    cache_key_on,
    language_model,
    report_progress,
    stage_dir,
    stage_key,
    transient_only,
)

EVAL_MODULES = ("dpcore.icl", "dpcore.prefix_cache", "dpcore.taskspec", "dpcore.lm", "dpcore.soft_prompt")
EVALUATE_KEY_FIELDS = ("data_hash", "task_spec", "method", "epsilon", "demo_keys", "eval_config", "labels",
                       "model", "dtype")
RANDOM_REAL = "random-real"
ZERO_SHOT = "zero-shot"
DPSGD = "dpsgd"  # demo_paths = [the trained prompt's safetensors], demo_keys = [its sha256]


@task(name="evaluate", cache_key_fn=cache_key_on("evaluate", EVALUATE_KEY_FIELDS, EVAL_MODULES),
      persist_result=True, result_serializer="json", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_SECONDS,
      retry_condition_fn=transient_only, task_run_name="evaluate-{method}-eps{epsilon}")
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
    from dpcore import icl
    from dpcore.taskspec import load_task_spec
    from tasks.ingest import public_test_split

    logger = get_run_logger()
    key = stage_key("evaluate", {name: value for name, value in locals().items() if name in EVALUATE_KEY_FIELDS},
                    EVAL_MODULES)
    spec = load_task_spec(task_spec)
    lm = language_model(model, device, dtype)
    test = public_test_split(records_path)
    past = None
    if method == ZERO_SHOT:
        pool = None
    elif method == DPSGD:  # a trained prompt (PromptDPSGD): its cache before every prompt, no demos
        from dpcore.soft_prompt import load_prompt

        pool = None
        past = load_prompt(demo_paths[0], lm.device)[0].cache_layers(lm)
    elif method == RANDOM_REAL:
        records = read_table(Path(records_path))
        pool = records[records["split"] == "train"][["id", "text", "label"]].reset_index(drop=True)
    else:
        frames = [read_table(Path(p)) for p in demo_paths]
        pool = pd.concat(frames, ignore_index=True)[["text", "label"]] if frames else None
    began = time.perf_counter()
    what = f"evaluate {method} eps={'inf' if math.isinf(epsilon) else f'{epsilon:g}'}"
    predictions, metrics = icl.evaluate(lm, spec, test, pool, method, epsilon, eval_config,
                                        labels=labels if spec.kind == "classification" else None,
                                        items_progress=lambda done, total: report_progress(what, done, total),
                                        past=past)
    seconds = time.perf_counter() - began
    out = stage_dir("evaluate", key)
    result = {"key": key, "method": method, "epsilon": float(epsilon), "seconds": seconds}
    if method == RANDOM_REAL:
        # real records' ids go to their own private table; an extraction task's answers, which may copy
        # the real records' words, are blanked like `dpicl evaluate` blanks them (one split for both)
        predictions, real = icl.split_private_demo_ids(predictions, free_text=spec.kind != "classification")
        real_path = write_table(real, stage_dir("evaluate", key, private=True) / "real_demos.parquet")
        result["real_demos_path"] = str(real_path)
    private_out = stage_dir("evaluate", key, private=True)
    result["predictions_path"] = str(write_table(predictions, private_out / "predictions.parquet"))
    result["metrics_path"] = str(write_table(metrics, out / "metrics.parquet"))
    result["metrics"] = metrics[["seed", "n", "accuracy", "calibrated_accuracy"]].to_dict(orient="records")
    logger.info(
        "evaluated %s at epsilon %s: accuracy %.3f, calibrated %.3f (mean over %d seeds, n=%d) in %.1f s",
        method, "inf" if math.isinf(epsilon) else f"{epsilon:g}", metrics["accuracy"].mean(),
        metrics["calibrated_accuracy"].mean(), len(metrics), int(metrics["n"].max()), seconds,
    )
    return result


def evaluation_plan(baselines: list[str], generated: list[dict]) -> list[dict]:
    """One evaluation per (method, epsilon): the requested baselines and every generated demo set."""
    plan: list[dict] = []
    if ZERO_SHOT in baselines:
        plan.append({"method": ZERO_SHOT, "epsilon": 0.0, "demo_paths": [], "demo_keys": []})
    groups: dict[tuple[str, float], list[dict]] = {}
    for shard in generated:
        groups.setdefault((shard["method"], float(shard["epsilon"])), []).append(shard)
    for (method, eps), shards in sorted(groups.items()):
        shards = sorted(shards, key=lambda s: s["label"])
        plan.append({"method": method, "epsilon": eps, "demo_paths": [s["path"] for s in shards],
                     "demo_keys": [s["key"] for s in shards]})
    if RANDOM_REAL in baselines:
        plan.append({"method": RANDOM_REAL, "epsilon": math.inf, "demo_paths": [], "demo_keys": []})
    return plan
