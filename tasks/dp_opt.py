"""DP-OPT's stages (Hong et al. 2024, `dpcore.dp_opt`): its parameters and plans on a run's data, the private
instruction per epsilon, its evaluation rows.

Parameters (`params`): the preset's (`dp_opt_preset`: gpu = the paper's `PAPER`, cpu = `SMOKE` with the
paper's 1% holdout, auto by device), each overridden by the run's `dp_opt_*` field when set; public, never
tuned on private data. The plan (`plans`): per finite epsilon > 0 of the run, `dpcore.dp_opt.privacy.dp_opt_plan` with n the number of records that
write (`generation_record_count`: the keyed-hash holdout excluded; a count of the records, as |D_y| is for
tang). The instruction (`write`): `dpcore.dp_opt.instruction.write_instruction` on the run's training records
(with their ids: ids decide sampling, subsets and holdout), written with its public stats (DP outputs and
public parameters) to the public run folder as `dp_opt_instruction_eps<E>.json`; the evaluation puts it in
front of a zero-shot prompt (`tasks.evaluate`, method `dp-opt`).

An instruction draws noise only under a charge this attempt of the run made, or continues what an earlier attempt
of the same run charged: it keeps its state after every token step in the run's private folder
(`dp-opt/eps<E>-<digest>.json`: the finished candidates and the current one's tokens, DP outputs, and the noise
generator's state), so a stopped run resumed under its id continues after its last finished step and draws no step
twice; an instruction charged but not begun is marked (`.pending`, `keep_charged`, right after the charge) and
written once. Anything else an earlier attempt charged is refused, never drawn again (start a new run).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from dpcore.config import RunConfig
from dpcore.data.artifacts import file_sha256, write_json_atomic
from dpcore.data.datasets import LoadedDataset
from dpcore.data.taskspec import load_task_spec
from dpcore.dp_opt.instruction import generation_record_count, write_instruction
from dpcore.dp_opt.presets import PAPER, SMOKE, DpOptParams
from dpcore.dp_opt.privacy import METHOD, dp_opt_plan
from dpcore.dp_opt.release import RELEASE
from dpcore.errors import ConfigError, DpiclError
from dpcore.lm import runtime
from dpcore.privacy.plan import PrivacyPlan
from dpcore.public_outputs import Kind, declare, declare_log
from tasks.common import (
    Ingested,
    derive_seed,
    language_model,
    report_progress,
    stage_logger,
    stop_requested,
    uncached_task,
)
from tasks.kept import KeptStage, mark_if_charged

# DP-OPT's public output: the instruction, every candidate's text, length and stop reason and the index kept
# are DP outputs; sigma, sigma_sel, q and the steps planned are public counts (`write_instruction`'s stats).
INSTRUCTION_FILE = RELEASE.artifact_file  # dp_opt_instruction_eps<E>.json
declare("file:*dp_opt_instruction_eps*.json", Kind.DP, "/instruction", "/stats/candidates", "/stats/tokens",
        "/stats/stopped", "/stats/chosen", "/stats/steps_used")
declare("file:*dp_opt_instruction_eps*.json", Kind.COUNT, "/stats/sampling_rate", "/stats/noise_multiplier",
        "/stats/selection_noise_multiplier", "/epsilon", "/delta")
WRITTEN_LOG = declare_log("dp-opt: wrote an instruction of %d token(s) at epsilon %s (sigma %.4g)", dp=(0,),
                          count=(2,))
OVERRIDES = ("subsets", "shots", "max_tokens", "candidates", "temperature")
# what `write` takes of a plan's parameters (finite numbers: a task's parameters are stored as JSON)
PLANNED = ("noise_multiplier", "selection_noise_multiplier", "max_tokens", "candidates", "subsets", "shots")


def params(config: RunConfig) -> DpOptParams:
    """DP-OPT's public parameters for a run: the preset's, with every `dp_opt_*` field that is set."""
    name = config.dp_opt.preset
    if name == "auto":
        from dpcore.lm.model import pick_device  # torch: only when the device decides

        name = "gpu" if pick_device(config.device).type == "cuda" else "cpu"
    # cpu: SMOKE's sizes, with the paper's 1% holdout (SMOKE's quarter would score a large file's candidates on
    # thousands of records)
    base = PAPER if name == "gpu" else replace(SMOKE, holdout_fraction=PAPER.holdout_fraction)
    return replace(base, **{k: getattr(config.dp_opt, k) for k in OVERRIDES
                            if getattr(config.dp_opt, k) is not None})


def records_by_label(train) -> dict[str, list[tuple[str, str]]]:
    """{label: [(id, text)]} of the training records (PRIVATE; ids, never row positions)."""
    return {str(label): list(zip(part["id"].astype(str), part["text"].astype(str), strict=True))
            for label, part in train.groupby("label", sort=True)}


def plans(config: RunConfig, data: LoadedDataset, delta: float) -> tuple[PrivacyPlan, ...]:
    """DP-OPT's plans, one per finite epsilon > 0 of the run (epsilon 0 reads no record; at epsilon inf the
    instruction would be no DP output, yet written to the public run folder: no DP-OPT row at either)."""
    if data.spec.kind != "classification":
        raise ConfigError(f"methods: DP-OPT's instruction is scored on labels; task {data.spec.name!r} is "
                          f"{data.spec.kind}")
    p = params(config)
    n = generation_record_count(records_by_label(data.train), p)
    return tuple(dp_opt_plan(eps, delta, p.max_tokens, p.subsets, shots=p.shots, records=n, candidates=p.candidates,
                             selection_share=p.selection_share)
                 for eps in sorted({float(e) for e in config.epsilons}) if 0 < eps < math.inf)


def work(config: RunConfig, plan: PrivacyPlan, *, labels: int, record_tokens: int) -> runtime.Work:
    """One plan's model work from public sizes (`tasks.methods` protocol): J candidates of T token steps, each
    M meta prompts of k records."""
    p = plan.parameters
    return runtime.Work(generation=runtime.generation_positions(
        labels=1, demos_per_label=int(p["candidates"]), num_subsets=int(p["subsets"]), subset_size=int(p["shots"]),
        max_tokens=int(p["max_tokens"]), record_tokens=record_tokens))


def _eps_text(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def kept_stage(call: dict) -> KeptStage | None:
    """The instruction's kept state and mark (`tasks.kept`), for its public inputs; None without a private
    folder."""
    if not call.get("private_run_dir"):
        return None
    config = call["config"]
    inputs = {"epsilon": call["epsilon"], "parameters": call["parameters"], "seed": call.get("seed"),
              "model": config.model, "dp_opt": config.dp_opt}
    return KeptStage.at_epsilon(call["private_run_dir"], METHOD, call["epsilon"], inputs)


def keep_charged(call: dict) -> None:
    """Mark the instruction of `call` (`write_call`) when this attempt charged it: an attempt stopped before it
    began may still write it once. Called right after the charge."""
    mark_if_charged(call, kept_stage(call))


@uncached_task("dp-opt-write", tags=["gpu"], task_run_name="dp-opt-write-eps{epsilon:g}")
def write(*, records_path: str, task_spec: str, epsilon: float, delta: float, parameters: dict, config: RunConfig,
          seed: int | None = None, noise_charged: bool = False, public_dir: str,
          private_run_dir: str | None = None) -> dict:
    """DP-OPT's instruction at one epsilon (`parameters`: its plan's noise multipliers and sizes, `PLANNED`),
    written to the public run folder. Returns {epsilon, path, key (the file's sha256), seeded_noise, tokens}.
    `private_run_dir`: where it keeps its state; an instruction an earlier attempt of the run charged continues
    from it (module docstring)."""
    from tasks.ingest import private_split

    kept = kept_stage(locals())
    resume = kept.state() if kept is not None else None
    if resume is None and not noise_charged and not (kept is not None and kept.marked()):
        raise DpiclError(f"dp-opt at epsilon {_eps_text(epsilon)}: this attempt did not charge the spend (an "
                         "earlier attempt of the run did) and no kept step of it is there; drawing fresh noise "
                         "would spend privacy the ledger charged once. Start a new run (a new --run-id).")

    p = params(config)
    for name in ("max_tokens", "candidates", "subsets", "shots"):
        if parameters[name] != getattr(p, name):
            raise DpiclError(f"dp-opt: the plan was made for {name} = {parameters[name]}; plan the run again")
    run_params = p.with_noise(parameters["noise_multiplier"], parameters["selection_noise_multiplier"] or 0.0)
    spec = load_task_spec(task_spec)
    lm = language_model(config.model, config.device, config.dtype)
    seeded = seed is not None
    rng = np.random.default_rng(seed)  # None: fresh OS entropy
    what = f"dp-opt eps={_eps_text(epsilon)}"  # the bar of its token steps; a stop request ends it at the next step
    if resume is not None:
        stage_logger().info("%s: continuing this run's instruction after its last kept token step", what)
    instruction, stats = write_instruction(lm, spec, records_by_label(private_split(records_path, "train")),
                                           run_params, rng, progress=lambda done, total: report_progress(what, done, total),
                                           should_stop=stop_requested,
                                           checkpoint=kept.keep if kept is not None else None, resume=resume)
    path = write_json_atomic(Path(public_dir) / INSTRUCTION_FILE.format(_eps_text(epsilon)),
                             {"method": METHOD, "epsilon": _jsonable(epsilon), "delta": float(delta),
                              "instruction": instruction, "stats": stats})
    stage_logger().info(WRITTEN_LOG, stats["tokens"][stats["chosen"]], _eps_text(epsilon),
                        parameters["noise_multiplier"])
    return {"epsilon": float(epsilon), "path": str(path), "key": file_sha256(Path(path)), "seeded_noise": seeded,
            "tokens": int(stats["tokens"][stats["chosen"]])}


def _jsonable(value: float):
    return "inf" if math.isinf(value) else float(value)


def write_call(config: RunConfig, ingested: Ingested, plan: PrivacyPlan, charged: bool) -> dict:
    """`write`'s arguments for one of DP-OPT's plans in a run (its seed derived from the run's and the epsilon)."""
    return dict(records_path=ingested.records_path, task_spec=ingested.task_spec, epsilon=plan.epsilon,
                delta=plan.delta, parameters={k: plan.parameters[k] for k in PLANNED}, config=config, seed=derive_seed(config.seed, METHOD, plan.epsilon),
                noise_charged=charged, public_dir=str(ingested.paths.public),
                private_run_dir=str(ingested.paths.private))


__all__ = ["INSTRUCTION_FILE", "METHOD", "keep_charged", "params", "plans", "records_by_label", "work", "write",
           "write_call"]
