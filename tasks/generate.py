"""Stage 4: synthetic demonstrations, one Prefect task per (label, epsilon), tagged `gpu`.

Each task calls `generate_for` (`dpcore.fewshot.generation`, Algorithm 1) for a single label with
a seed derived from the run seed and (method, label, epsilon), so the demos are the same
whichever runner (threads, a Dask worker, a GPU worker) executes it. The baselines run
through the same task: sigma = 0 (epsilon = infinity (a), same code path, no noise) and
instruction-only (epsilon = 0, the public prompt alone, no private data read). `dpicl generate`
calls the same `generate_for` for every label at once (`flows.standalone`).

The plan of generation tasks (`GenerationItem`s) comes from the run's `FewShotPlan`
(`dpcore.fewshot.plan`); a task's result is a `Shard` (public).

Outputs: DP and instruction-only demos are DP/public outputs and go to the public stage
folder; sigma = 0 demos carry no privacy guarantee, so they stay in the private store.
The task result, its log lines and progress lines hold only public counters (steps,
synthetic tokens, demos: functions of the DP outputs and the configuration). Counters that
depend on the sampled records (prompts, prompt/forward/padded tokens, the wall time and its
phases, tokens/s) go to a private `generation_stats.json` in the private stage folder
(`private_stats_path`).

Stopping and resuming: a DP generation task of a pipeline run keeps its `GenerationState` (each finished
token step's DP output and the generators' states) in the run's private folder, `generation/<stage>.json`,
before its first draw and after every step. A later attempt of the same run continues from it: the steps
it took stay as they were and the steps left to T_max are drawn, under the charge the run already made (a
step that did not finish released nothing). The flow marks every generation whose spend an attempt
charged, before any of them starts (`keep_charged`: `generation/<stage>.pending`, replaced by the state at
the first draw), so an attempt stopped before a stage began may still draw it once. With neither, a spend
charged by an earlier attempt is never drawn again: the stage is refused.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from dpcore.data.artifacts import write_json_atomic, write_table
from dpcore.errors import DpiclError
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import INSTRUCTION_ONLY, SIGMA_ZERO, TANG, FewShotPlan
from dpcore.public_outputs import Kind, declare, declare_line, declare_log
from tasks.common import (
    Ingested,
    cached_task,
    derive_seed,
    digest,
    open_stage,
    report_progress,
    safe_name,
    stage_dir,
    stage_logger,
)
from tasks.kept import KeptStage, mark_if_charged

__all__ = ["TANG", "INSTRUCTION_ONLY", "SIGMA_ZERO", "GenerationItem", "Shard", "check_generation", "empty_demos_note",
           "generate", "generate_call", "generate_for", "generation_plan", "keep_charged", "step_line"]
GENERATION_MODULES = ("dpcore.fewshot.generation", "dpcore.fewshot.mechanisms", "dpcore.fewshot.sampling", "dpcore.data.taskspec", "dpcore.lm.model")
# Generation's public outputs: the demos and what is counted from them alone (tokens, steps until every demo
# ended, empty demos) are DP outputs; sigma follows from |D_y|.
declare("file:cache/stages/generate/*/demos.parquet", Kind.DP, "/*")
declare("file:cache/stages/generate/*/prefect-result.json", Kind.DP, "/result/**/demos", "/result/**/tokens",
        "/result/**/steps")
declare("file:cache/stages/generate/*/prefect-result.json", Kind.COUNT, "/result/**/noise_multiplier")
GENERATED_LOG = declare_log("generated %d %s demo(s) for label %s at epsilon %s (sigma %.4g), %d tokens",
                            dp=(0, 5), count=(4,))
declare_line(Kind.DP, r": step (\d+)/\d+, (\d+)/\d+ demos done$")  # `step_line`: when demos end is a DP output
# Public inputs that determine a generation task's output (the records themselves enter through data_hash).
GENERATE_KEY_FIELDS = ("data_hash", "task_spec", "method", "label", "epsilon", "noise_multiplier", "generation",
                       "model", "dtype", "seed", "noise_scope")


class GenerationItem(BaseModel):
    """One generation task of a run: a label's demos of one row (tang, sigma-zero, instruction-only) at one
    epsilon, with its sigma and its seed derived from the run seed."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    method: str
    label: str
    epsilon: float
    noise_multiplier: float
    seed: int | None


class Shard(BaseModel):
    """A generation task's result: where its demos are and public counters (never a record)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    key: str
    method: str
    label: str
    epsilon: float
    noise_multiplier: float
    path: str
    private: bool
    demos: int
    tokens: int
    steps: int
    seeded_noise: bool
    worker: str
    private_stats_path: str


def demos_are_private(method: str) -> bool:
    """sigma = 0 demos are a non-private baseline: they stay in the private store."""
    return method == SIGMA_ZERO


# A row's seed stream keeps the name it had when seeds were first derived: a --seed draws the same noise as
# before DP few-shot generation's row was named tang.
SEED_STREAMS = {TANG: "dp"}


def generation_plan(labels: list[str], plan: FewShotPlan, run_seed: int | None) -> list[GenerationItem]:
    """One item per generation task: every (row, epsilon, sigma) of the plan (`FewShotPlan.generations`)
    for every label, each with a seed derived from the run seed."""
    return [GenerationItem(method=method, label=label, epsilon=eps, noise_multiplier=sigma,
                           seed=derive_seed(run_seed, SEED_STREAMS.get(method, method), label, eps))
            for method, eps, sigma in plan.generations() for label in labels]


def generate_call(item: GenerationItem, ingested: Ingested, generation: GenerationConfig, config, noise_scope: str,
                  noise_charged: bool) -> dict:
    """The keyword arguments of the `generate` task for one item of a pipeline run (its kept state in the run's
    private folder)."""
    return dict(records_path=None if item.method == INSTRUCTION_ONLY else ingested.records_path,
                data_hash=ingested.data_hash, task_spec=ingested.task_spec, method=item.method,
                label=item.label, epsilon=item.epsilon, noise_multiplier=item.noise_multiplier,
                generation=generation, model=config.model, device=config.device, dtype=config.dtype, seed=item.seed,
                noise_scope=noise_scope, noise_charged=noise_charged,
                private_run_dir=str(ingested.paths.private))


def _kept_stage(private_run_dir: str | None, call: dict) -> KeptStage | None:
    """`generation/<method>-<label>-eps<E>-<digest>` in the run's private folder (`tasks.kept`), fingerprinted by
    the stage's public inputs (`GENERATE_KEY_FIELDS`), not its code; None for a stage that keeps nothing (no
    run folder, or the instruction-only prompt, which reads no record)."""
    if not private_run_dir or call["method"] == INSTRUCTION_ONLY:
        return None
    method, label, epsilon = call["method"], call["label"], call["epsilon"]
    name = f"{safe_name(method)}-{safe_name(label)}-eps{_eps_text(epsilon)}-{digest([method, label, epsilon])[:8]}"
    return KeptStage(Path(private_run_dir) / "generation", name,
                     digest({field: call.get(field) for field in GENERATE_KEY_FIELDS}))


def keep_charged(calls: list[dict]) -> None:
    """Mark every DP generation of `calls` whose spend this attempt charged (`noise_charged`) and that has not
    drawn yet (`generation/<stage>.pending`): an attempt stopped before the stage began may still draw it once.
    Called right after the charge, before any generation starts."""
    for call in calls:
        mark_if_charged(call, _kept_stage(call.get("private_run_dir"), call))


def check_generation(generation: GenerationConfig, *, label_counts: dict[str, int] | None = None,
                     vocab_size: int | None = None) -> None:
    """Algorithm 1's parameter checks (`dpcore.fewshot.generation.validate_generation`), before anything is charged:
    with `label_counts`, every label holds N records and q <= 1; with `vocab_size`, K within the model's
    vocabulary (after the model loads)."""
    from dpcore.fewshot.generation import validate_generation

    validate_generation(generation, 0.0, vocab_size or sys.maxsize, label_counts)


def generate_for(lm, spec, method: str, labels: list[str], generation: GenerationConfig, noise_multiplier: float,
                 *, records_by_label: dict[str, list[str]] | None, seed: int | None,
                 progress: Callable[[dict], None] | None = None, checkpoint=None, resume=None):
    """The demos of one row for `labels`: instruction-only from the public prompt alone (no record read),
    otherwise Algorithm 1 at sigma on `records_by_label` (private; kept in memory), its state handed to
    `checkpoint` at every step and continued from `resume` (`dpcore.fewshot.generation.GenerationState`)."""
    from dpcore.fewshot import generation as engine

    if method == INSTRUCTION_ONLY:
        return engine.instruction_only_demos(lm, spec, labels, generation, seed=seed, progress=progress)
    if records_by_label is None:
        raise ValueError(f"generate: method {method!r} needs the private records")
    return engine.generate_demos(lm, spec, records_by_label, generation, noise_multiplier, seed=seed, labels=labels,
                                 progress=progress, checkpoint=checkpoint, resume=resume)


def step_line(what: str, info: dict) -> str:
    """The one log line of a generation step (`dpcore.fewshot.generation`'s progress dict: public counters only):
    `generate tang World eps=1: step 3/20, 0/1 demos done`."""
    return f"{what}: step {info['step']}/{info['max_steps']}, {info['finished']}/{info['total']} demos done"


def report_steps(what: str, info: dict) -> None:
    """A generation step on the terminal's bar: steps out of T_max, until every demo has ended; a generation whose
    demos all ended early (at an end token: when is a DP output) completes its bar at the step it ended on."""
    step, steps = info["step"], info["max_steps"]
    ended = info["finished"] >= info["total"] and step < steps
    report_progress(what, step, step if ended else steps, f"every demo ended before step {steps}" if ended else "")


def empty_demos_note(frame, what: str) -> str | None:
    """A DP output worth saying: demos the model ended at their first token (they add nothing to a prompt)."""
    empty = int((frame["tokens"] == 0).sum()) if "tokens" in frame else 0
    if not empty:
        return None
    return (f"{empty} of {len(frame)} {what} demo(s) are empty (no token generated): they add nothing to a prompt; "
            "a larger epsilon, top_k (--top-k) or another model may help")


@cached_task("generate", GENERATE_KEY_FIELDS, GENERATION_MODULES, private_outputs=True, tags=["gpu"],
             task_run_name="generate-{method}-{label}-eps{epsilon:g}")
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
    private_run_dir: str | None = None,
) -> Shard:
    """Generate `generation.demos_per_label` demos for one label at one epsilon; returns its `Shard`.

    `noise_charged` and `private_run_dir` (not part of the cache key): this attempt of the run charged the
    spend, so a fresh draw is covered; the run's private folder, where the generation keeps its state (see
    the module docstring). A spend charged by an earlier attempt of the same run is continued from its kept
    state, or drawn once when that attempt marked it charged and it never began; otherwise it is refused,
    never drawn again.
    """
    from dpcore.fewshot.generation import GenerationState, demos_frame
    from tasks.ingest import records_by_label

    kept = _kept_stage(private_run_dir, locals())
    state = kept.state() if kept is not None else None
    resume = GenerationState.from_dict(state) if state is not None else None
    if method != INSTRUCTION_ONLY and resume is None:
        if not noise_charged and not (kept is not None and kept.marked()):
            # seeded or not: the charge covers one draw
            raise DpiclError(
                f"stage generate-{method}-{label}-eps{_eps_text(epsilon)} ({noise_scope}): the cached noise draw of "
                "this run is missing (neither its stage's cached result nor the steps it kept are there, or they "
                "were made for another configuration); drawing fresh noise would spend privacy the ledger charged "
                "only once. Start a new run (a new --run-id): it is charged afresh.")
    logger = stage_logger()
    key, spec, lm = open_stage("generate", locals(), GENERATE_KEY_FIELDS, GENERATION_MODULES, task_spec=task_spec,
                               model=model, device=device, dtype=dtype)
    began = time.perf_counter()

    what = f"generate {method} {label} eps={_eps_text(epsilon)}"

    def progress(info: dict) -> None:  # one log line per step, naming its label (public counters only)
        report_steps(what, info)
        logger.info(step_line(what, info))

    def checkpoint(state) -> None:
        # private store only: the finished steps and the generators' states; it has begun, so its mark goes
        kept.keep(state.to_dict())

    if resume is not None:
        logger.info("%s: continuing this run's generation after step %d of %d", what, resume.step,
                    generation.max_tokens)
    records = None if method == INSTRUCTION_ONLY else records_by_label(records_path, [label])
    result = generate_for(lm, spec, method, [label], generation, noise_multiplier, records_by_label=records,
                          seed=seed, progress=progress, checkpoint=checkpoint if kept is not None else None, resume=resume)
    seconds = time.perf_counter() - began
    frame = demos_frame(result.demos)
    note = empty_demos_note(frame, f"{method} {label} eps={_eps_text(epsilon)}")
    if note:
        logger.warning(note)
    frame["method"] = method
    frame["epsilon"] = float(epsilon)
    private = demos_are_private(method)
    path = write_table(frame, stage_dir("generate", key, private=private) / "demos.parquet")
    tokens = int(frame["tokens"].sum()) if "tokens" in frame else 0
    # Record-dependent counters (prompt tokens, padding, timings) stay in the private store.
    stats_path = write_json_atomic(
        stage_dir("generate", key, private=True) / "generation_stats.json",
        {"method": method, "label": label, "epsilon": _eps_text(epsilon), "seconds": seconds,
         "stats": dict(result.stats), "private_stats": dict(result.private_stats)},
    )
    # no wall time: it depends on the sampled groups' lengths (the private stats file keeps it)
    logger.info(
        GENERATED_LOG,
        len(frame), method, label, _eps_text(epsilon), noise_multiplier, tokens,
    )
    return Shard(key=key, method=method, label=label, epsilon=float(epsilon), noise_multiplier=float(noise_multiplier),
                 path=str(path), private=private, demos=len(frame), tokens=tokens,
                 steps=int(result.stats.get("steps", 0)), seeded_noise=bool(result.seeded_noise),
                 worker=f"{socket.gethostname()}:{os.getpid()}", private_stats_path=str(stats_path))


def _eps_text(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"
