"""CLI: `dpicl tune` — PromptDPSGD: train a soft prompt or prefix with DP-SGD, evaluate it, record it.

    dpicl tune --dataset D --kind soft-prompt|prefix|lora|full --epsilon 8 [--length S | --rank R --clip C --batch-size B
               --epochs E | --steps T --lr LR --init vocab|random|instruction --seeds K --test-size N --delta D
               --preset auto|cpu|gpu --model M --device DEV --seed S --run-id ID] [--json]

Runs `flows.tune.dpsgd_flow` (the same flow the pipeline runs for `--methods dpsgd`). Unset training
flags come from the preset (`--preset auto`: the GPU preset, Duan et al. Table 6, on CUDA; the CPU preset
otherwise). The budget is checked by a dry run before any model loads; over budget: exit 3, nothing spent.
`--json` prints one object whose top level holds epsilon, delta, noise_multiplier, sampling_rate, steps,
accuracy {mean, std}, prompt (path of the first trained prompt), prompts, params (the training parameters)
and the run's ids and paths.
"""

from __future__ import annotations

import math
import sys
from typing import get_args

from dpcore.config import RunConfig
from dpcore.display import fmt_delta, fmt_eps, fmt_sigma
from dpcore.errors import ConfigError
from flows.cli import common as cli
from flows.cli.common import fmt_value as _fmt
from flows.cli.progress import showing_progress, stopping_on_signals
from flows.cli.run import delta_note, format_ledger

CONFIG_FLAGS = [*cli.DATA_FLAGS, "delta", "seed", "test_size", "calibrate"]
# Short spellings of the dpsgd_* fields (the long `--dpsgd-*` forms work too).
SHORT_FLAGS = {"kind": "dpsgd_kind", "length": "dpsgd_length", "rank": "dpsgd_rank", "clip": "dpsgd_clip", "batch_size": "dpsgd_batch_size",
               "epochs": "dpsgd_epochs", "steps": "dpsgd_steps", "lr": "dpsgd_lr", "init": "dpsgd_init",
               "seeds": "dpsgd_seeds", "preset": "dpsgd_preset", "validation_size": "dpsgd_validation_size",
               "physical_batch_size": "dpsgd_physical_batch_size", "validation_path": "dpsgd_validation_path"}


def _choices(annotation) -> list[str]:
    """The values of a Literal field, an optional one too."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return list(get_args(args[0])) if len(args) == 1 and get_args(args[0]) else list(args)


def register(subparsers) -> None:
    parser = cli.command(
        subparsers, "tune", run_tune, help="PromptDPSGD: train a soft prompt or prefix (or the LoRA / full fine-tuning baselines) with DP-SGD "
        "(Duan et al. Section 4.1, Table 1)",
        description="Train a soft prompt or prefix on the private data with DP-SGD (Duan et al. App. C.1 "
        "Algorithm 1, Opacus), evaluate it on the test split and record it (safetensors + manifest, MLflow).")
    parser.add_argument("--epsilon", type=cli.parse_epsilon, required=True, help="target epsilon (> 0; inf: no noise)")
    cli.add_config_flags(parser, CONFIG_FLAGS)
    for short, field in SHORT_FLAGS.items():
        info = RunConfig.flat_field(field)
        choices = _choices(info.annotation) if short in ("kind", "init", "preset") else None
        parser.add_argument("--" + short.replace("_", "-"), "--" + field.replace("_", "-"), dest=field, default=None,
                            choices=choices, type=None if choices else cli._flag_type(field, info.annotation),
                            help=(info.description or "").replace("%", "%%"))
    cli.add_output_flags(parser, run_id=True)


def _config(args) -> RunConfig:
    return cli.checked_config(args, epsilons=[args.epsilon], methods=["dpsgd"])


def run_tune(args) -> int:
    from dpcore.dpsgd.training import (
        dpsgd_config,  # torch: loaded when a command trains, not for `dpicl --help`
    )
    from flows.tune import plan_tuning, run_tuning

    if args.epsilon == 0:
        raise ConfigError("--epsilon: must be > 0 (or inf) for PromptDPSGD; zero-shot is the epsilon = 0 comparison")
    config = _config(args)
    dpsgd_config(config)  # every training parameter in range before anything runs
    if math.isinf(args.epsilon):
        print(f"WARNING: --epsilon inf trains without noise (sigma = 0): charged to ledger id '{config.ledger_id}' as "
              "an infinite spend; the prompt carries no privacy guarantee.", file=sys.stderr, flush=True)
    plan, _ = plan_tuning(config, args.run_id)  # data size, plans, budget (exit 3), model: before the flow starts
    # no wall time: training's depends on the Poisson batches and the sampled records' lengths
    with stopping_on_signals(), showing_progress(not args.json):
        summary = run_tuning(config, run_id=args.run_id, plan=plan)
    row = summary["results"][0]
    params = {**summary["plans"][0]["parameters"], "trainable_parameters": summary["trainable_parameters"]}
    out = {
        "epsilon": row["epsilon"], "delta": row["delta"], "noise_multiplier": row["noise_multiplier"],
        "sampling_rate": row["sampling_rate"], "steps": row["steps"],
        "accuracy": {"mean": row["accuracy_mean"], "std": row["accuracy_std"], "n": row["n"],
                     "trainings": row["trainings"]},
        "calibrated_accuracy": {"mean": row["calibrated_accuracy_mean"], "std": row["calibrated_accuracy_std"]},
        "prompt": summary["prompts"][0]["path"], "prompts": [p["path"] for p in summary["prompts"]],
        "params": params, "kind": params["kind"], "length": params.get("length"),
        "rank": params.get("rank"), "clip": params["clip"],
        "batch_size": params["batch_size"], "lr": params["lr"], "epochs": params["epochs"],
        "seeded_noise": summary["seeded_noise"], "run_id": summary["run_id"], "run_dir": summary["run_dir"],
        "dataset": summary["dataset"], "model": summary["model"], "mlflow_run_ids": summary["mlflow_run_ids"],
        "ledger": summary["ledger_after"], "curve": summary["prompts"][0]["curve"],
    }
    if args.json:
        cli.print_json(out)
        return 0
    shape = f"rank {params['rank']}, " if "rank" in params else f"length {params['length']}, " if "length" in params else ""
    print(f"PromptDPSGD {params['kind']} ({shape}{params['trainable_parameters']} parameters) on "
          f"{summary['model']}, dataset {summary['dataset']}")
    print(f"epsilon {fmt_eps(row['epsilon'])} (delta {fmt_delta(row['delta'])}), sigma {fmt_sigma(row['noise_multiplier'])}, "
          f"q {row['sampling_rate']:.3g}, T {row['steps']} steps ({params['epochs']:.3g} epochs), C {params['clip']:g}, "
          f"lr {params['lr']:g}" + ("  [seeded noise: experiment only, not releasable]" if out["seeded_noise"] else ""))
    print(f"test accuracy {_fmt(row['accuracy_mean'])} +/- {_fmt(row['accuracy_std'])} over {row['trainings']} "
          f"training(s), {row['n']} test items (calibrated {_fmt(row['calibrated_accuracy_mean'])})")
    note = delta_note(config, float(row["delta"]))
    if note:
        print(note)
    ledger = format_ledger(summary["ledger_after"])
    if ledger:
        print(ledger)
    print(f"prompt:          {out['prompt']}")
    print(f"run id:          {summary['run_id']}")
    return 0


