"""Stage 4: synthetic demonstrations, one Prefect task per (label, epsilon), tagged `gpu`.

Each task calls `dpcore.generation.generate_demos` (Algorithm 1) for a single label with
a seed derived from the run seed and (method, label, epsilon), so the demos are the same
whichever runner (threads, a Dask worker, a GPU worker) executes it. The baselines run
through the same task: sigma = 0 (epsilon = infinity (a), same code path, no noise) and
instruction-only (epsilon = 0, the public prompt alone, no private data read).

Outputs: DP and instruction-only demos are DP/public outputs and go to the public stage
folder; sigma = 0 demos carry no privacy guarantee, so they stay in the private store.
The task result, its log lines and progress lines hold only public counters (steps,
synthetic tokens, demos: functions of the DP outputs and the configuration) and the
total time rounded to whole seconds. Counters that depend on the sampled records
(prompts, prompt/forward/padded tokens, per-phase timings, tokens/s) go to a private
`generation_stats.json` in the private stage folder (`private_stats_path`).
"""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path

from prefect import get_run_logger, task

from dpcore.artifacts import write_json_atomic, write_table
from dpcore.config import GenerationConfig
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

GENERATION_MODULES = ("dpcore.generation", "dpcore.mechanisms", "dpcore.sampling", "dpcore.taskspec", "dpcore.lm")
# Public inputs that determine a generation task's output (the records themselves enter through data_hash).
GENERATE_KEY_FIELDS = ("data_hash", "task_spec", "method", "label", "epsilon", "noise_multiplier", "generation",
                       "model", "dtype", "seed", "noise_scope")

# Generation methods of the pipeline (Tang et al. Table 1 rows that generate demos).
DP = "dp"
SIGMA_ZERO = "sigma-zero"
INSTRUCTION_ONLY = "instruction-only"


def demos_are_private(method: str) -> bool:
    """sigma = 0 demos are a non-private baseline: they stay in the private store."""
    return method == SIGMA_ZERO


@task(name="generate", tags=["gpu"], cache_key_fn=cache_key_on("generate", GENERATE_KEY_FIELDS, GENERATION_MODULES),
      persist_result=True, result_serializer="json", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_SECONDS,
      retry_condition_fn=transient_only, task_run_name="generate-{method}-{label}-eps{epsilon}")
def generate(
    *,
    records_path: str | None,
    data_hash: str,
    task_spec: str,
    method: str,
    label: str,
    epsilon: float,
    noise_multiplier: float,
    generation: GenerationConfig,
    model: str,
    device: str = "auto",
    dtype: str = "auto",
    seed: int | None = None,
    noise_scope: str = "",
    noise_charged: bool = False,
) -> dict:
    """Generate `generation.demos_per_label` demos for one label at one epsilon; returns paths and counters.

    `noise_charged` (not part of the cache key): this attempt of the run charged the spend, so a fresh
    draw is covered. Otherwise the spend was charged by an earlier attempt of the same run and only its
    cached draw may be served: an unseeded draw that has to run again is refused, never redrawn.
    """
    from dpcore import generation as dp_generation
    from dpcore.taskspec import load_task_spec
    from tasks.ingest import records_by_label

    if method != INSTRUCTION_ONLY and seed is None and not noise_charged:
        from dpcore.errors import DpiclError

        raise DpiclError(
            f"stage generate-{method}-{label}-eps{_eps_text(epsilon)} ({noise_scope}): the cached noise draw of this "
            "run is missing (its stage folder or cache record is gone) and the run is not seeded; drawing fresh "
            "noise would spend privacy the ledger charged only once. Start a new run (a new --run-id): it is "
            "charged afresh.")
    logger = get_run_logger()
    key = stage_key("generate", {name: value for name, value in locals().items() if name in GENERATE_KEY_FIELDS},
                    GENERATION_MODULES)
    spec = load_task_spec(task_spec)
    lm = language_model(model, device, dtype)
    began = time.perf_counter()

    def progress(info: dict) -> None:  # a Prefect log line every 10 steps (public counters only)
        report_progress(f"generate {method} {label} eps={_eps_text(epsilon)}", info["step"], info["max_steps"])
        if info["step"] % 10 == 0 or info["finished"] == info["total"]:
            logger.info("%s %s eps=%s: step %d/%d, %d/%d demos done", method, label, _eps_text(epsilon),
                        info["step"], info["max_steps"], info["finished"], info["total"])

    if method == INSTRUCTION_ONLY:
        result = dp_generation.instruction_only_demos(lm, spec, [label], generation, seed=seed, progress=progress)
    else:
        if records_path is None:
            raise ValueError(f"generate: method {method!r} needs the private records table")
        by_label = records_by_label(records_path, [label])
        result = dp_generation.generate_demos(lm, spec, by_label, generation, noise_multiplier, seed=seed,
                                              labels=[label], progress=progress)
    seconds = time.perf_counter() - began
    frame = dp_generation.demos_frame(result.demos)
    empty = int((frame["tokens"] == 0).sum()) if "tokens" in frame else 0
    if empty:  # a DP output: the model ended the demo at its first token
        logger.warning("%d of %d %s demo(s) for label %s at epsilon %s are empty (no token generated): they add "
                       "nothing to a prompt; a larger epsilon, top_k or another model may help", empty, len(frame),
                       method, label, _eps_text(epsilon))
    frame["method"] = method
    frame["epsilon"] = float(epsilon)
    private = demos_are_private(method)
    path = write_table(frame, stage_dir("generate", key, private=private) / "demos.parquet")
    tokens = int(frame["tokens"].sum()) if "tokens" in frame else 0
    # Record-dependent counters (prompt tokens, padding, timings) stay in the private store.
    stats_path = write_json_atomic(
        stage_dir("generate", key, private=True) / "generation_stats.json",
        {"method": method, "label": label, "epsilon": _eps_text(epsilon), "seconds": seconds,
         "stats": dict(getattr(result, "stats", {})), "private_stats": dict(getattr(result, "private_stats", {}))},
    )
    # Wall-clock time depends on the records' lengths too: a weak timing channel, and one Prefect's own
    # task-run timestamps expose anyway. Only the total, in whole seconds, is public; exact timings are private.
    public_seconds = round(seconds)
    logger.info(
        "generated %d %s demo(s) for label %s at epsilon %s (sigma %.4g) in about %d s, %d tokens",
        len(frame), method, label, _eps_text(epsilon), noise_multiplier, public_seconds, tokens,
    )
    return {
        "key": key,
        "method": method,
        "label": label,
        "epsilon": float(epsilon),
        "noise_multiplier": float(noise_multiplier),
        "path": str(path),
        "private": private,
        "demos": len(frame),
        "tokens": tokens,
        "steps": int(getattr(result, "stats", {}).get("steps", 0)),
        "seconds": public_seconds,
        "seeded_noise": bool(getattr(result, "seeded_noise", seed is not None)),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "private_stats_path": str(stats_path),
    }


def _eps_text(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def generation_plan(labels: list[str], calibration_rows: list[dict], baselines: list[str], run_seed: int | None
                    ) -> list[dict]:
    """One entry per generation task: (method, label, epsilon, sigma, derived seed).

    DP at each finite positive epsilon; sigma-zero (epsilon = inf) and instruction-only
    (epsilon = 0) when requested as baselines or as epsilons.
    """
    from tasks.common import derive_seed

    plan: list[dict] = []
    methods: dict[tuple[str, float], float] = {}
    for row in calibration_rows:
        eps = float(row["epsilon"])
        if eps == 0:
            methods[(INSTRUCTION_ONLY, 0.0)] = 0.0
        elif math.isinf(eps):
            methods[(SIGMA_ZERO, math.inf)] = 0.0
        else:
            methods[(DP, eps)] = float(row["noise_multiplier"])
    if SIGMA_ZERO in baselines:
        methods.setdefault((SIGMA_ZERO, math.inf), 0.0)
    if INSTRUCTION_ONLY in baselines:
        methods.setdefault((INSTRUCTION_ONLY, 0.0), 0.0)
    for (method, eps), sigma in sorted(methods.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        for label in labels:
            plan.append({"method": method, "label": label, "epsilon": eps, "noise_multiplier": sigma,
                         "seed": derive_seed(run_seed, method, label, eps)})
    return plan


def shard_exists(result: dict) -> bool:
    return Path(result["path"]).exists()
