"""PromptDPSGD stages (Duan et al. Section 4.1): plan, checks, train (tag `gpu`), metrics, record.

Thin Prefect tasks over `dpcore.dpsgd.training` and `dpcore.dpsgd.soft_prompt`; evaluation is the pipeline's own
`tasks.evaluate.evaluate` (method "dpsgd": the trained prompt's cache before every test prompt).

- `plans`: one `PrivacyPlan` per positive epsilon of the run (sigma calibrated for T steps at rate
  q = batch / N, N = every private record; delta = 1/N unless given); `dpsgd_seeds` independent trainings each, each a spend.
  `method_plan` is its part of a run's plan (`tasks.methods` protocol: `plans` after its checks on the data), `work`
  its model work in the run's time estimate.
- `check_model`: the checks that need the model (a soft prompt needs input embeddings; a prefix a
  per-layer key/value cache), run before the charge.
- `train_prompt` (tag `gpu`): Algorithm 1 for one (epsilon, training). Resumable: a checkpoint (P,
  AdamW, schedule, both generators' states) is kept in the private store at step 0, every `checkpoint_every`
  steps and at the last finished step when the run is stopped, and a retry of the same run continues it, so
  the noise stream is the uninterrupted run's and the one ledger entry covers it (`dpcore.dpsgd.training`). A
  finished prompt is reused by a retry. `keep_charged` marks every training whose spend an attempt charged,
  right after the charge and before any training starts (`checkpoints/<name>.pending`, keyed by the
  training's `training_fingerprint`; removed once the training keeps its step-0 checkpoint), so a training that had
  not begun when its attempt stopped may still start once. A training whose spend this attempt did not
  charge (a replay) and that has neither a finished prompt, a checkpoint nor a matching mark is refused,
  seeded or not: fresh noise is never drawn under an old charge.
- Public outputs (run folder): `prompts/dpsgd-eps<E>-<i>.safetensors` and its `.json` manifest (model id
  and weight hash, kind, length, epsilon, delta, sigma, q, T, C, accountant versions), the loss curve on
  PUBLIC labelled examples (`public_validation`: post-processing of the DP prompt). Private (private run
  folder): checkpoints, the per-step training losses (a non-DP function of the sampled batches) and the
  ids of the records the Poisson batches drew (the release audit's members).
"""

from __future__ import annotations

import io
import json
import math
from importlib import metadata
from pathlib import Path

import pandas as pd
import torch
from prefect import get_run_logger

from dpcore.config import RunConfig
from dpcore.data.artifacts import (
    file_sha256,
    read_table,
    write_bytes_atomic,
    write_json_atomic,
    write_manifest,
    write_table,
    write_text_atomic,
)
from dpcore.data.datasets import load_test_file
from dpcore.data.taskspec import load_task_spec
from dpcore.dpsgd import adapters
from dpcore.dpsgd import training as dpsgd
from dpcore.dpsgd.soft_prompt import (
    check_prompt,
    encode_examples,
    init_prompt,
    instruction_ids,
    save_prompt,
    weights_hash,
)
from dpcore.dpsgd.training import dpsgd_config, dpsgd_plan
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.home import is_private_path
from dpcore.lm import runtime
from dpcore.lm.config import EvalConfig
from dpcore.lm.icl import check_test_size
from dpcore.names import ADAPTER_KINDS
from dpcore.privacy.plan import PrivacyPlan
from dpcore.public_outputs import Kind, declare, declare_log
from dpcore.report.summary import summarise_metrics
from tasks.common import (
    Ingested,
    code_version,
    derive_seed,
    digest,
    language_model,
    report_progress,
    uncached_task,
)
from tasks.tracking import experiment_id, log_batch, mlflow_client

METHOD = "dpsgd"
CURVE_COLUMNS = ["epsilon", "training", "step", "val_loss", "epsilon_spent"]

# PromptDPSGD's public outputs: the trained prompt or adapter (its tensors), its loss curve on public examples and
# its accuracy on the test items are DP outputs; sigma, q, the epochs and the epsilon spent so far follow from |D|;
# the manifest's fingerprint digests the keyed data hash with the configuration (an identity).
_PROMPT_MANIFEST = {Kind.DP: ("/curve/*/val_loss",),
                    Kind.COUNT: ("/curve/*/epsilon", "/noise_multiplier", "/sampling_rate", "/epochs", "/training_records"),
                    Kind.IDENTITY: ("/data_hash", "/fingerprint")}
for _kind, _paths in _PROMPT_MANIFEST.items():
    declare("file:*prompts/dpsgd-*.json", _kind, *_paths)
    declare("file:*prompt/dpsgd-*.json", _kind, *_paths)  # the copy logged to MLflow
declare("file:*dpsgd-*.safetensors", Kind.DP, "/tensors")
declare("file:*dpsgd_curve.parquet", Kind.DP, "/*/val_loss")
declare("file:*dpsgd_curve.parquet", Kind.COUNT, "/*/epsilon_spent")
for _output in ("file:*dpsgd_results.parquet", "json:tune", "json:run"):
    declare(_output, Kind.DP, "**/accuracy*", "**/calibrated_accuracy*", "**/curve/*/val_loss")
    declare(_output, Kind.COUNT, "**/noise_multiplier", "**/sampling_rate", "**/epochs", "**/training_records",
            "**/curve/*/epsilon")
TRAINING_STEP_LOG = declare_log("%s step %d/%d: public validation loss %.4f, epsilon spent %.3f", dp=(3,), count=(4,))
TRAINED_LOG = declare_log("%s: %d steps, final public validation loss %s", dp=(2,))
# Without public validation examples (a user's own data and no file declared public) there is no loss to log.
UNVALIDATED_STEP_LOG = declare_log("%s step %d/%d: epsilon spent %.3f (no public validation examples)", count=(3,))
RESUMED_LOG = "%s: continuing this run's training after step %d of %d"  # public: the plan's step counts
UNVALIDATED_LOG = ("%s: %d steps, no validation loss: no public validation examples (a shipped task's public split, "
                   "or a labelled file you declare public: " + flag("dpsgd_validation_path") + ")")


def _eps_name(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def training_count(config: RunConfig, num_private_records: int) -> int:
    """N: the private examples trained on: every private record (the loss curve is on public examples)."""
    return int(num_private_records)


def plans(config: RunConfig, num_private_records: int) -> list[PrivacyPlan]:
    """One plan per positive epsilon (epsilon 0 is the zero-shot comparison: nothing to train)."""
    dp_config = dpsgd_config(config)
    n = training_count(config, num_private_records)
    epsilons = sorted({float(e) for e in config.epsilons if e != 0})
    if not epsilons:
        raise ConfigError("epsilon: PromptDPSGD needs an epsilon > 0 (or inf); zero-shot is the epsilon = 0 "
                          "comparison")
    return [dpsgd_plan(eps, n, dp_config, config.delta, trainings=config.dpsgd.seeds) for eps in epsilons]


def method_plan(config: RunConfig, data, delta: float) -> tuple[PrivacyPlan, ...]:
    """Its plans on the run's data (`tasks.methods` protocol; `plans`: batch within the training records, sigma
    reachable) after its checks: a classification task, `--test-size` within the test split. Its delta is its
    own (`plans`: the flag, else 1/N)."""
    if data.spec.kind != "classification":
        raise ConfigError(f"methods: PromptDPSGD trains prompts for classification tasks; task "
                          f"{data.spec.name!r} is {data.spec.kind}")
    check_test_size(config.test_size, len(data.test))
    return tuple(plans(config, len(data.train)))


def work(config: RunConfig, plans_: tuple[PrivacyPlan, ...], *, labels: int, record_tokens: int,
         test_items: int) -> runtime.Work:
    """Its model work from public sizes (`tasks.methods` protocol; `dpcore.lm.runtime.dpsgd_positions`): per plan,
    every training's steps of expected batches, forward and backward, then the test items."""
    total = runtime.Work()
    for plan in plans_:
        p = plan.parameters
        total += runtime.Work(dpsgd=runtime.dpsgd_positions(int(p["steps"]), int(p["batch_size"]), int(p["trainings"]),
                                                            test_items, labels, record_tokens))
    return total


def audited_in_run(summary: dict) -> list[tuple[float, float | None]]:
    """The run's membership audit checks the first training at each epsilon (`tasks.methods` protocol)."""
    epsilons = {float(row["epsilon"]) for row in summary.get("results", []) if row.get("method") == METHOD}
    return [(epsilon, epsilon) for epsilon in sorted(epsilons)]


def check_model(config: RunConfig) -> dict:
    """The trainable prompt fits the model (loaded here, before the charge: no private record is read)."""
    lm = language_model(config.model, config.device, config.dtype)
    dp_config = dpsgd_config(config)
    if dp_config.kind in ADAPTER_KINDS:
        parameters = adapters.check_adapter(lm, dp_config.kind, dp_config.rank)
        return {"shape": [parameters], "parameters": parameters}
    shape = check_prompt(lm, dp_config.kind, dp_config.length)
    return {"shape": list(shape), "parameters": int(math.prod(shape))}


def accountant_versions() -> dict[str, str]:
    versions = {}
    for package in ("prv-accountant", "dp-accounting", "opacus"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return versions


def public_validation(spec, records_path: str, validation_path: str | None, size: int) -> pd.DataFrame:
    """The loss curve's labelled examples, all PUBLIC: a file the user declares public, else the shipped
    task's public split (rows `public` of the records table, written for a shipped source only); the first
    `size` in id order (a public rule). Empty: no curve."""
    if size < 1:
        return pd.DataFrame(columns=["id", "text", "label"])
    if validation_path:
        frame = load_test_file(spec, validation_path)
    else:
        records = read_table(Path(records_path))
        frame = records[records["split"] == "public"][["id", "text", "label"]]
    return frame.sort_values("id", kind="stable").head(size).reset_index(drop=True)


def _examples(lm, spec, records_path: str, validation: pd.DataFrame):
    """(train, validation) examples: every private record is trained on (in memory only); the validation
    examples are public."""
    records = read_table(Path(records_path))
    train = records[records["split"] == "train"].reset_index(drop=True)
    examples = encode_examples(lm, spec, train["text"].astype(str).tolist(), train["label"].astype(str).tolist())
    public = encode_examples(lm, spec, validation["text"].astype(str).tolist(),
                             validation["label"].astype(str).tolist()) if len(validation) else []
    return examples, list(public), train["id"].astype(str).tolist()


def training_name(epsilon: float, training: int) -> str:
    """`dpsgd-eps<E>-<i>`: a training's files (prompt, checkpoint, mark) are named by it."""
    return f"dpsgd-eps{_eps_name(epsilon)}-{training}"


def training_fingerprint(*, data_hash: str, plan: dict, epsilon: float, training: int, config: RunConfig) -> str:
    """What a training's checkpoint, mark and prompt are for: its data, spend, configuration, model and seed
    (the flow's mark and the task's check agree through this one function)."""
    return digest({"data_hash": data_hash, "spend": plan["spends"][training], "config": dpsgd_config(config),
                   "model": config.model, "seed": derive_seed(config.seed, METHOD, epsilon, training),
                   "training": training, "delta": plan["delta"]})


def _pending_path(private_dir: str, name: str) -> Path:
    """`checkpoints/<name>.pending` in the run's private folder: a charged training that has not begun."""
    path = Path(private_dir) / "checkpoints" / f"{name}.pending"
    if not is_private_path(path):
        raise PermissionError(f"{path.name}: a training's mark belongs in the private store")
    return path


def _pending_matches(private_dir: str, name: str, fingerprint: str) -> bool:
    path = _pending_path(private_dir, name)
    return path.exists() and json.loads(path.read_text()).get("fingerprint") == fingerprint


def keep_charged(calls: list[dict]) -> None:
    """Mark every training of `calls` (`train_prompt`'s arguments) whose spend this attempt charged
    (`noise_charged`): an attempt stopped before the training began leaves it startable once by a retry.
    Called right after the charge, before any training starts."""
    for call in calls:
        if not call["noise_charged"]:
            continue
        mark = {"fingerprint": training_fingerprint(data_hash=call["data_hash"], plan=call["plan"],
                                                    epsilon=call["epsilon"], training=call["training"],
                                                    config=call["config"])}
        write_text_atomic(_pending_path(call["private_dir"], training_name(call["epsilon"], call["training"])),
                          json.dumps(mark) + "\n")


@uncached_task("train-prompt", tags=["gpu"], task_run_name="train-prompt-eps{epsilon:g}-{training}")
def train_prompt(*, records_path: str, data_hash: str, task_spec: str, plan: dict, epsilon: float, training: int,
                 config: RunConfig, public_dir: str, private_dir: str, noise_charged: bool) -> dict:
    """Train one prompt (Algorithm 1); returns public paths and the validation curve. Its wall time depends on
    the Poisson batches' sizes and the sampled records' lengths: it stays in the private training file.
    `noise_charged`: this attempt charged the training's spend; otherwise it continues from its checkpoint, or
    starts once when the attempt that charged it marked it (`keep_charged`), or is refused."""
    logger = get_run_logger()
    dp_config = dpsgd_config(config)
    spend = plan["spends"][training]
    seed = derive_seed(config.seed, METHOD, epsilon, training)
    name = training_name(epsilon, training)
    prompt_path = Path(public_dir) / "prompts" / f"{name}.safetensors"
    checkpoint_path = Path(private_dir) / "checkpoints" / f"{name}.pt"
    pending_path = _pending_path(private_dir, name)
    fingerprint = training_fingerprint(data_hash=data_hash, plan=plan, epsilon=epsilon, training=training, config=config)
    lm = language_model(config.model, config.device, config.dtype)
    weights = weights_hash(lm.model)
    manifest = _finished_manifest(prompt_path, fingerprint)
    if manifest is not None:  # a retry after this training finished
        logger.info("%s: reusing the finished prompt of this run", name)
        return {"epsilon": epsilon, "training": training, "prompt_path": str(prompt_path),
                "curve": manifest.get("curve", []), "seeded_noise": manifest["seeded_noise"], "reused": True}
    resume = _resume_state(name, checkpoint_path, fingerprint,
                           noise_charged or _pending_matches(private_dir, name, fingerprint))
    if resume is not None:
        logger.info(RESUMED_LOG, name, int(resume["step"]), spend["steps"])
    spec = load_task_spec(task_spec)
    validation = public_validation(spec, records_path, config.dpsgd.validation_path, dp_config.validation_size)
    train_examples, val_examples, train_ids = _examples(lm, spec, records_path, validation)
    noise_gen, sampling_gen, seeded = dpsgd.generators(seed, lm.device)
    prompt = _start(lm, spec, dp_config, sampling_gen)

    def keep(state: dict) -> None:  # private store only: P, optimizer and generator states
        buffer = io.BytesIO()
        torch.save(state, buffer)
        write_bytes_atomic(checkpoint_path, buffer.getvalue())
        pending_path.unlink(missing_ok=True)  # it has begun: its checkpoints serve a retry from now on

    result = dpsgd.train(lm, prompt, train_examples, val_examples, noise_multiplier=spend["noise_multiplier"],
                         sampling_rate=spend["sampling_rate"], steps=spend["steps"], clip=dp_config.clip,
                         lr=dp_config.lr, delta=plan["delta"], noise_generator=noise_gen,
                         sampling_generator=sampling_gen, seeded=seeded,
                         physical_batch_size=dp_config.physical_batch_size, eval_every=dp_config.eval_every,
                         checkpoint_every=dp_config.checkpoint_every, checkpoint=keep, resume=resume,
                         fingerprint=fingerprint,
                         progress=_training_progress(name, epsilon, training, logger, validated=bool(val_examples)))
    if weights_hash(lm.model) != weights:
        raise RuntimeError(f"{name}: the frozen model's weights changed during training")
    manifest = {
        "method": METHOD, "model": config.model, "model_weights_sha256": weights, "data_hash": data_hash,
        "epsilon": epsilon, "delta": plan["delta"], "noise_multiplier": spend["noise_multiplier"],
        "sampling_rate": spend["sampling_rate"], "steps": spend["steps"], "clip": dp_config.clip,
        "batch_size": dp_config.batch_size, "lr": dp_config.lr, "training": training,
        "task_spec": task_spec, "seeded_noise": seeded, "accountants": accountant_versions(),
        "code_version": code_version(), "fingerprint": fingerprint, "curve": result.curve,
        "optimizer": "adamw (weight decay 0), linear decay to 0",
    }
    if dp_config.kind in ADAPTER_KINDS:
        adapters.save_adapter(result.prompt, prompt_path, manifest)
    else:
        save_prompt(result.prompt, prompt_path, {**manifest, "init": dp_config.init})
    write_json_atomic(Path(private_dir) / "training" / f"{name}.json",
                      {"training_losses": result.private_losses, "seconds": result.seconds,
                       "sampled_ids": [train_ids[i] for i in sorted(result.sampled)]})
    checkpoint_path.unlink(missing_ok=True)
    if val_examples:
        logger.info(TRAINED_LOG, name, spend["steps"],
                    f"{result.curve[-1]['val_loss']:.4f}" if result.curve else "-")
    else:
        logger.info(UNVALIDATED_LOG, name, spend["steps"])
    return {"epsilon": epsilon, "training": training, "prompt_path": str(prompt_path), "curve": result.curve,
            "seeded_noise": seeded, "reused": False}


def _start(lm, spec, dp_config, generator):
    """What training starts from (Algorithm 1 line 2): P_0 of a prompt kind, or the adapter's start on a copy
    of the model (`adapters.init_adapter`)."""
    if dp_config.kind in ADAPTER_KINDS:
        return adapters.init_adapter(lm, dp_config.kind, generator, dp_config.rank)
    return init_prompt(lm, dp_config.kind, dp_config.length, dp_config.init, generator,
                       instruction_ids(lm, spec)).to(lm.device)


def _finished_manifest(prompt_path: Path, fingerprint: str) -> dict | None:
    """The manifest of this very training's finished prompt (same fingerprint), or None."""
    manifest_path = prompt_path.with_suffix(".json")
    if not (prompt_path.exists() and manifest_path.exists()):
        return None
    manifest = json.loads(manifest_path.read_text())
    return manifest if manifest.get("fingerprint") == fingerprint else None


def _resume_state(name: str, checkpoint_path: Path, fingerprint: str, may_start: bool) -> dict | None:
    """The checkpoint a retry continues from (refused when it belongs to another plan or data), or None for a
    fresh training, which only a spend this attempt charged, or one its charging attempt marked and never
    began (`may_start`), may start."""
    if checkpoint_path.exists():
        resume = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        dpsgd.check_resume(resume, fingerprint)
        return resume
    if not may_start:  # seeded or not: the charge covers one training
        raise ConfigError(f"{name}: its spend was charged by an earlier attempt of this run and neither its prompt "
                          "nor its checkpoint exists; fresh noise is never drawn under an old charge: start a new "
                          "run id")
    return None


def _training_progress(name: str, epsilon: float, training: int, logger, validated: bool = True):
    """The `progress(step, steps, info)` callback of `dpsgd.train`: a bar with public values only, and a log
    line at each public validation (`validated`: there are public validation examples; without, the line has
    the epsilon spent only)."""
    what = f"tune eps={_eps_name(epsilon)} #{training}: DP-SGD steps"
    last: dict = {}

    def progress(step: int, steps: int, info: dict) -> None:
        last.update(info)
        # the bar's detail: public values only (the loss on public examples, epsilon spent); no per-step
        # timing, which would reveal the Poisson batch sizes and the records' lengths
        shown = (("val_loss", "public val loss {:.3f}"), ("epsilon", "epsilon {:.2f}"))
        detail = ", ".join(form.format(last[key]) for key, form in shown
                           if last.get(key) is not None and math.isfinite(last[key]))
        report_progress(what, step, steps, detail)
        if "epsilon" in info and not validated:
            logger.info(UNVALIDATED_STEP_LOG, name, step, steps, info["epsilon"])
        elif "epsilon" in info:
            logger.info(TRAINING_STEP_LOG, name, step, steps,
                        info["val_loss"], info["epsilon"])

    return progress


def evaluation_calls(config: RunConfig, ingested: Ingested, trained: list[dict]) -> list[dict]:
    """`tasks.evaluate.evaluate` calls, one per trained prompt (no demos, one seed each: a training is the
    unit that varies)."""
    eval_config = EvalConfig(shots=0, seeds=1, test_size=config.test_size, calibrate=config.calibrate)
    return [dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                 task_spec=ingested.task_spec, method=METHOD, epsilon=t["epsilon"], demo_paths=[t["prompt_path"]],
                 demo_keys=[file_sha256(Path(t["prompt_path"]))], eval_config=eval_config,
                 labels=list(ingested.labels), model=config.model, device=config.device, dtype=config.dtype)
            for t in trained]


def metrics_table(trained: list[dict], evaluations: list[dict]) -> pd.DataFrame:
    """The evaluations' metrics with `seed` = the training index (accuracy mean +/- std over trainings)."""
    frames = []
    for t, e in zip(trained, evaluations, strict=True):
        frames.append(read_table(Path(e["metrics_path"])).assign(seed=t["training"]))
    return pd.concat(frames, ignore_index=True)


def summary_rows(plans_: list[PrivacyPlan], metrics: pd.DataFrame) -> list[dict]:
    """One public row per epsilon: the plan's parameters and accuracy mean/std over trainings."""
    summary = {float(r["epsilon"]): r for r in summarise_metrics(metrics).to_dict(orient="records")}
    rows = []
    for plan in plans_:
        s = summary.get(float(plan.epsilon), {})
        spend = plan.spends[0]
        rows.append({"method": METHOD, "epsilon": plan.epsilon, "delta": plan.delta,
                     "noise_multiplier": spend.noise_multiplier, "sampling_rate": spend.sampling_rate,
                     "steps": spend.steps, "trainings": len(plan.spends), "n": s.get("n"),
                     "accuracy_mean": s.get("accuracy_mean"), "accuracy_std": s.get("accuracy_std"),
                     "calibrated_accuracy_mean": s.get("calibrated_accuracy_mean"),
                     "calibrated_accuracy_std": s.get("calibrated_accuracy_std")})
    return rows


@uncached_task("record-tuning")
def record_tuning(*, config: RunConfig, info: dict, rows: list[dict], trained: list[dict]) -> dict:
    """Public tables, the run folder's manifest, and MLflow: one run per epsilon with the plan's parameters,
    epsilon, accuracy, the validation loss and epsilon-spent curves (per step) and the prompts as artifacts."""
    from mlflow.entities import Metric

    public = Path(info["run_dir"])
    curve = pd.DataFrame([{"epsilon": t["epsilon"], "training": t["training"], "step": p["step"],
                           "val_loss": p.get("val_loss"), "epsilon_spent": p.get("epsilon")}
                          for t in trained for p in t["curve"]], columns=CURVE_COLUMNS)
    write_table(curve, public / "dpsgd_curve.parquet")
    write_table(pd.DataFrame(rows), public / "dpsgd_results.parquet")
    write_manifest(public, extra={"run_id": info["run_id"], "dataset": info["dataset"], "data_hash": info["data_hash"],
                                  "model": config.model, "method": METHOD, "code_version": code_version(),
                                  "seeded_noise": info["seeded_noise"], "config": config.flat()})
    client = mlflow_client()
    exp = experiment_id(client, info["dataset"])
    tags = {"data_hash": info["data_hash"], "model": config.model, "code_version": code_version(),
            "seeded_noise": str(bool(info["seeded_noise"])).lower(), "dataset": info["dataset"],
            "dpicl_run_id": info["run_id"], "method": METHOD}
    run_ids = []
    for row in rows:
        run = client.create_run(exp, run_name=f"dpsgd-eps{_eps_name(row['epsilon'])}",
                                tags={**tags, "epsilon": _eps_name(row["epsilon"])})
        run_id = run.info.run_id
        try:
            log_batch(client, run_id, params={**config.flat(), "method": METHOD, "epsilon": _eps_name(row["epsilon"]),
                                         "noise_multiplier": row["noise_multiplier"],
                                         "sampling_rate": row["sampling_rate"], "steps": row["steps"]},
                 metrics={k: row[k] for k in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps",
                                              "accuracy_mean", "accuracy_std", "calibrated_accuracy_mean",
                                              "calibrated_accuracy_std")})
            points = curve[(curve["epsilon"] == row["epsilon"]) & (curve["training"] == 0)]
            history = [Metric(key, float(p[column]), 0, int(p["step"])) for p in points.to_dict(orient="records")
                       for key, column in (("val_loss", "val_loss"), ("epsilon_spent", "epsilon_spent"))
                       if p[column] is not None and math.isfinite(float(p[column]))]
            if history:
                client.log_batch(run_id, metrics=history)
            for t in trained:
                if t["epsilon"] == row["epsilon"]:
                    client.log_artifact(run_id, t["prompt_path"], "prompt")
                    client.log_artifact(run_id, str(Path(t["prompt_path"]).with_suffix(".json")), "prompt")
            client.set_terminated(run_id)
        except BaseException:
            client.set_terminated(run_id, status="FAILED")
            raise
        run_ids.append(run_id)
    if info.get("private_run_dir"):
        write_manifest(Path(info["private_run_dir"]), extra={"run_id": info["run_id"]})
    return {"mlflow_run_ids": run_ids, "mlflow_experiment_id": exp}
