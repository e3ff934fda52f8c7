"""AdaDPSyn's stages (Gao et al. 2024, `dpcore.adadpsyn`): its plans on a run's data, its DP demonstrations
per epsilon, their evaluation rows.

The plan (`plans`): per epsilon > 0 of the run, `dpcore.adadpsyn.plan.adadpsyn_plan` at Algorithm 1's sizes
(q = the largest MN/|D_y| over the labels, T = max_tokens x demos per label, as `tasks.calibrate` plans
tang's), PFIRR's public parameters from the run's `adadpsyn_*` fields (the paper's by default), sigma_avg
calibrated. The generation (`generate`): Algorithm 1's engine (`dpcore.fewshot.generation.generate_demos`) with
PFIRR as its token step (`dpcore.adadpsyn.step.token_chooser`), every label at once, its demos named
`adadpsyn` and carrying sigma_eff; they are DP outputs and go to the public run folder.

A generation draws noise only under a charge this attempt of the run made (`noise_charged`), or continues what an
earlier attempt of the same run charged: as tang's (`tasks.generate`), it keeps its state after every token step in
the run's private folder (`adadpsyn/eps<E>-<digest>.json`: the finished steps' tokens, a DP output, and the noise
streams' states), so a stopped run resumed under its id continues after its last finished step and draws no step
twice; a generation charged but not begun is marked (`.pending`, `keep_charged`, right after the charge) and drawn
once. Anything else an earlier attempt charged is refused, never drawn again (start a new run).
"""

from __future__ import annotations

import math
from pathlib import Path

from dpcore.adadpsyn.params import PfirrParams
from dpcore.adadpsyn.plan import METHOD, adadpsyn_plan
from dpcore.adadpsyn.release import RELEASE
from dpcore.config import RunConfig
from dpcore.data.artifacts import file_sha256, write_table
from dpcore.data.datasets import LoadedDataset
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import ConfigError, DpiclError
from dpcore.fewshot.accounting import total_steps
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import run_sampling_rate
from dpcore.lm import runtime
from dpcore.privacy.plan import PrivacyPlan
from dpcore.public_outputs import Kind, declare, declare_log
from tasks.calibrate import generation_config
from tasks.common import Ingested, derive_seed, language_model, stage_logger, uncached_task
from tasks.generate import check_generation, report_steps
from tasks.kept import KeptStage, mark_if_charged

# AdaDPSyn's public outputs: its demonstrations (DP outputs, with the plan's sigma_eff, a function of public
# counts), its rows in the results (accuracies of DP prompts: DP; sigma_eff and q: public counts).
declare("file:*adadpsyn_demos*.parquet", Kind.DP, "/*")
GENERATED_LOG = declare_log("adadpsyn: generated %d demo(s) at epsilon %s (sigma_eff %.4g, sigma_avg %.4g)",
                            dp=(0,), count=(2, 3))
PFIRR_FIELDS = ("sigma_radius", "sigma_test", "tolerance", "coverage", "shrink", "test_fraction", "updates")


def hyperparameters(config: RunConfig) -> PfirrParams:
    """PFIRR's public parameters from the run's AdaDPSyn section (`RunConfig.adadpsyn`, flat names `adadpsyn_*`;
    sigma_avg: calibrated by the plan)."""
    return PfirrParams(sigma_avg=1.0, **{name: getattr(config.adadpsyn, name) for name in PFIRR_FIELDS})


def generation(config: RunConfig, num_labels: int) -> GenerationConfig:
    """Algorithm 1's sizes for AdaDPSyn: the run's M, N, K, RVP, T_max (the Gaussian kind: PFIRR adds Gaussian
    noise), demos per label from --shots."""
    return generation_config(config, num_labels).model_copy(update={"mechanism": "gaussian"})


def plans(config: RunConfig, data: LoadedDataset, delta: float) -> tuple[PrivacyPlan, ...]:
    """AdaDPSyn's plans on the run's data (`tasks.methods` protocol): `label_plans` on its label counts |D_y|."""
    if data.spec.kind != "classification":
        raise ConfigError(f"methods: AdaDPSyn generates demonstrations per label; task {data.spec.name!r} is "
                          f"{data.spec.kind}")
    return label_plans(config, data.label_counts(), delta)


def label_plans(config: RunConfig, label_counts: dict[str, int], delta: float) -> tuple[PrivacyPlan, ...]:
    """AdaDPSyn's plans, one per finite epsilon > 0 of the run (epsilon 0 is tang's instruction-only row; at
    epsilon inf its demonstrations would be no DP output, yet written to the public run folder: no row), after
    Algorithm 1's checks on the public counts (N records per label, q <= 1). ConfigError for an unreachable
    target (the radius search and tests alone cost more)."""
    gen = generation(config, len(label_counts))
    check_generation(gen, label_counts=label_counts)
    q = run_sampling_rate(label_counts, gen.num_subsets, gen.subset_size)
    steps = total_steps(gen.max_tokens, gen.demos_per_label)
    hyper = hyperparameters(config)
    return tuple(adadpsyn_plan(eps, delta, q, steps, hyper=hyper, num_groups=gen.num_subsets, top_k=gen.top_k)
                 for eps in sorted({float(e) for e in config.epsilons}) if 0 < eps < math.inf)


def work(config: RunConfig, plan: PrivacyPlan, *, labels: int, record_tokens: int) -> runtime.Work:
    """One plan's model work from public sizes (`tasks.methods` protocol): Algorithm 1's forwards at the run's
    sizes (PFIRR itself runs no model)."""
    return runtime.Work(generation=runtime.generation_positions(
        labels=labels, demos_per_label=max(1, math.ceil(config.shots / max(labels, 1))),
        num_subsets=config.num_subsets, subset_size=config.subset_size, max_tokens=config.max_tokens,
        record_tokens=record_tokens))


def pfirr_of(parameters: dict) -> PfirrParams:
    """The PFIRR parameters a plan's `parameters` hold (`dpcore.adadpsyn.plan.pfirr_params`, from its dict)."""
    return PfirrParams(sigma_avg=parameters["sigma_avg"], **{name: parameters[name] for name in PFIRR_FIELDS})


def _eps_text(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def kept_stage(call: dict) -> KeptStage | None:
    """The generation's kept state and mark (`tasks.kept`), for its public inputs; None without a private folder."""
    if not call.get("private_run_dir"):
        return None
    inputs = {name: call.get(name) for name in ("epsilon", "parameters", "generation", "model", "seed")}
    return KeptStage.at_epsilon(call["private_run_dir"], METHOD, call["epsilon"], inputs)


def keep_charged(call: dict) -> None:
    """Mark the generation of `call` (`generate_call`) when this attempt charged it: an attempt stopped before it
    began may still draw it once. Called right after the charge."""
    mark_if_charged(call, kept_stage(call))


@uncached_task("adadpsyn-generate", tags=["gpu"], task_run_name="adadpsyn-generate-eps{epsilon:g}")
def generate(*, records_path: str, task_spec: str, epsilon: float, parameters: dict, generation: GenerationConfig,
             model: str, device: str = "auto", dtype: str = "auto", seed: int | None = None,
             noise_charged: bool = False, public_dir: str, private_run_dir: str | None = None) -> dict:
    """AdaDPSyn's demonstrations for every label at one epsilon (`parameters`: its plan's); written to the
    public run folder. Returns {epsilon, path, key (the file's sha256), seeded_noise, demos} (public).
    `private_run_dir`: where it keeps its state; a generation an earlier attempt of the run charged continues
    from it (module docstring)."""
    from dpcore.adadpsyn.accounting import effective_noise_multiplier
    from dpcore.adadpsyn.step import token_chooser
    from dpcore.fewshot.generation import GenerationState, demos_frame, generate_demos
    from tasks.ingest import records_by_label

    kept = kept_stage(locals())
    kept_state = kept.state() if kept is not None else None
    resume = GenerationState.from_dict(kept_state) if kept_state is not None else None
    if resume is None and not noise_charged and not (kept is not None and kept.marked()):
        # seeded or not: the charge covers one draw
        raise DpiclError(f"adadpsyn at epsilon {_eps_text(epsilon)}: this attempt did not charge the spend (an "
                         "earlier attempt of the run did) and no kept step of it is there; drawing fresh noise "
                         "would spend privacy the ledger charged once. Start a new run (a new --run-id).")

    def checkpoint(state) -> None:  # private store only: the finished steps and the noise streams' states
        kept.keep(state.to_dict())

    params = pfirr_of(parameters)
    sigma_eff = effective_noise_multiplier(params)
    spec, lm = load_task_spec(task_spec), language_model(model, device, dtype)
    records = records_by_label(records_path)
    what = f"generate adadpsyn eps={_eps_text(epsilon)}"  # its steps on the bar; a stop request ends it at the next
    if resume is not None:
        stage_logger().info("%s: continuing this run's generation after step %d of %d", what, resume.step,
                            generation.max_tokens)
    result = generate_demos(lm, spec, records, generation, sigma_eff, seed=seed,
                            chooser=token_chooser(generation, params), method=METHOD,
                            progress=lambda info: report_steps(what, info),
                            checkpoint=checkpoint if kept is not None else None, resume=resume)
    frame = demos_frame(result.demos)
    frame["method"] = METHOD
    frame["epsilon"] = float(epsilon)
    path = write_table(frame, Path(public_dir) / RELEASE.artifact_file.format(_eps_text(epsilon)))
    stage_logger().info(GENERATED_LOG, len(frame), _eps_text(epsilon), sigma_eff, params.sigma_avg)
    return {"epsilon": float(epsilon), "path": str(path), "key": file_sha256(path),
            "seeded_noise": bool(result.seeded_noise), "demos": len(frame)}


def generate_call(config: RunConfig, ingested: Ingested, plan: PrivacyPlan, num_labels: int, charged: bool) -> dict:
    """`generate`'s arguments for one of AdaDPSyn's plans in a run (its seed derived from the run's and the
    epsilon)."""
    return dict(records_path=ingested.records_path, task_spec=ingested.task_spec, epsilon=plan.epsilon,
                parameters={k: plan.parameters[k] for k in ("sigma_avg", *PFIRR_FIELDS)}, generation=generation(config, num_labels), model=config.model,
                device=config.device, dtype=config.dtype, seed=derive_seed(config.seed, METHOD, plan.epsilon),
                noise_charged=charged, public_dir=str(ingested.paths.public),
                private_run_dir=str(ingested.paths.private))
