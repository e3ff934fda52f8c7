"""CLI: `dpicl generate` — calibrate sigma and run DP few-shot generation alone.

    dpicl generate --dataset NAME --epsilon E [--model NAME] [--shots S] [--num-subsets M]
                   [--subset-size N] [--top-k K] [--no-rvp] [--max-tokens T]
                   [--mechanism gaussian|rnm] [--seed S] [--out DIR] [--json]
                   [--data-path FILE --task-spec YAML] [--delta D] [--sampler poisson|fixed]
                   [--device DEV] [--dtype DTYPE] [--dataset-id ID]

`--shots S` is the number of demonstrations in an ICL prompt: each label gets
`demos_per_label(S, labels)` synthetic demos and the privacy steps are
T = max_tokens * demos_per_label. `--epsilon inf` runs with sigma = 0 (no noise);
`--epsilon 0` generates from the instruction alone (no private record is read, nothing is
charged). The demos Parquet goes to `--out DIR` or
`$DPICL_HOME/runs/<dataset>/<content_hash[:12]>/generate-<timestamp>/demos.parquet`,
written atomically next to `generation.json` (privacy report, public counters) and a manifest.
Only DP outputs, public counters (steps, synthetic tokens, demos) and public configuration are
printed or written there; the total time is given in whole seconds only. Counters that depend on
the private records (prompt/forward/padded tokens, prompts, per-phase timings, tokens/s) go to
`generation_stats.json` under `$DPICL_HOME/private/runs/<dataset>/<hash12>/<out folder name>/`.
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from dpcore.config import RunConfig, demos_per_label
from dpcore.errors import ConfigError
from flows.cli.common import add_config_flags, config_from_args, jsonable, parse_epsilon, print_json

log = logging.getLogger("dpicl.generate")

CONFIG_FLAGS = ["dataset", "data_path", "test_path", "task_spec", "dataset_id", "model", "device", "dtype", "delta",
                "mechanism", "sampler", "num_subsets", "subset_size", "top_k", "rvp", "max_tokens", "max_record_tokens",
                "seed", "shots"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="calibrate sigma and generate DP synthetic demonstrations (Algorithm 1)",
        description="Generate differentially private synthetic demonstrations (Tang et al. Algorithm 1) and "
        "write the demos Parquet. Prints only synthetic (DP) text and public configuration.")
    parser.add_argument("--epsilon", type=parse_epsilon, required=True,
                        help="target epsilon; 'inf' = sigma 0 (no noise); 0 = instruction-only (no private data)")
    add_config_flags(parser, CONFIG_FLAGS)
    parser.add_argument("--out", default=None, help="output folder (default: under $DPICL_HOME/runs/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_generate)


def _config(args) -> RunConfig:
    try:
        return config_from_args(args, epsilons=[args.epsilon])
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
                             for err in exc.errors())
        raise ConfigError(problems) from None
    except ValueError as exc:  # an int flag that is not an int
        raise ConfigError(str(exc)) from None


def _privacy(epsilon: float, label_counts: dict[str, int], config: RunConfig, steps: int, delta: float) -> dict:
    """sigma for the run: one sigma calibrated at the largest sampling rate (labels compose in parallel)."""
    from dpcore import accounting

    if math.isinf(epsilon):  # sigma = 0: no noise, no calibration
        rates = {label: accounting.sampling_rate(config.num_subsets, config.subset_size, count)
                 for label, count in label_counts.items() if count > 0}
        return {"epsilon": math.inf, "target_epsilon": math.inf, "delta": delta, "noise_multiplier": 0.0,
                "sampling_rate": max(rates.values()), "steps": steps, "mechanism": config.mechanism,
                "limiting_label": max(rates, key=rates.get), "per_label_epsilon": dict.fromkeys(rates, math.inf),
                "crosscheck_agreed": True, "warnings": []}
    result = accounting.calibrate_for_labels(epsilon, label_counts, config.num_subsets, config.subset_size, steps,
                                             delta, mechanism=config.mechanism)
    report = result["report"]
    return {
        "epsilon": float(result["epsilon"]), "target_epsilon": float(epsilon), "delta": float(result["delta"]),
        "noise_multiplier": float(result["noise_multiplier"]), "sampling_rate": float(result["sampling_rate"]),
        "steps": int(result["steps"]), "mechanism": result["mechanism"], "limiting_label": result["limiting_label"],
        "per_label_epsilon": {label: float(r.epsilon) for label, r in result["per_label"].items()},
        "epsilon_lower": float(report.epsilon_lower), "epsilon_crosscheck": float(report.epsilon_crosscheck),
        "crosscheck_agreed": bool(result["crosscheck_agreed"]), "warnings": list(result["warnings"]),
    }


def _default_out(dataset, home) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return home / "runs" / dataset.spec.name / dataset.content_hash[:12] / f"generate-{stamp}-{secrets.token_hex(2)}"


def _charge_request(config: RunConfig, dataset, run_id: str, privacy: dict):
    """The ledger request of this generation (every `dpicl generate` draws fresh noise: always charged)."""
    from dpcore.ledger import ChargeRequest

    return ChargeRequest(dataset_id=config.ledger_id, content_hash=dataset.content_hash, run_id=run_id,
                         mechanism=config.mechanism, noise_multiplier=privacy["noise_multiplier"],
                         sampling_rate=privacy["sampling_rate"], steps=privacy["steps"], delta=privacy["delta"],
                         purpose="generate")


def check_out(out: Path) -> Path:
    """`--out` must be a folder this process can write, checked before anything is charged (nothing is
    created here: the first existing ancestor must be a writable folder)."""
    import os

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {out}: {probe} is a file, so the folder cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {probe} is not writable")
    return out


def run_generate(args) -> int:
    from dpcore.artifacts import write_json_atomic, write_manifest, write_table
    from dpcore.datasets import load_dataset
    from dpcore.generation import demos_frame, generate_demos, instruction_only_demos
    from dpcore.home import dpicl_home, private_dir
    from dpcore.lm import LanguageModel
    from dpcore.taskspec import load_task_spec
    from flows.cli.progress import showing_progress, stopping_on_signals
    from tasks.common import report_progress

    began = time.perf_counter()
    config = _config(args)
    epsilon = float(args.epsilon)
    if args.out:
        check_out(Path(args.out))
    spec = load_task_spec(config.task_spec or config.dataset)
    dataset = load_dataset(spec, config.data_path, config.test_path)
    labels = dataset.labels
    label_counts = dataset.label_counts()
    per_label = demos_per_label(config.shots, len(labels))
    gen_config = config.generation_config().model_copy(update={"demos_per_label": per_label})
    steps = config.max_tokens * per_label
    from dpcore import accounting
    from dpcore.generation import validate_generation
    from dpcore.ledger import Ledger
    from dpcore.models import context_length
    from tasks.charge import check_max_tokens

    # Every check that can fail runs before the charge; the budget refusal before the model loads.
    validate_generation(gen_config, 0.0, sys.maxsize, label_counts if epsilon > 0 else None)
    if epsilon > 0:  # the longest group prompt fits the model's context (tokenizer only, before the charge)
        from dpcore.records import check_model_budget

        check_model_budget(config.model, spec, labels, gen_config)
    delta = config.delta if config.delta is not None else accounting.default_delta(len(dataset.train))
    if epsilon == 0:
        privacy = {"epsilon": 0.0, "delta": 0.0, "noise_multiplier": math.inf, "sampling_rate": 0.0,
                   "steps": steps, "mechanism": config.mechanism, "warnings": []}
    else:
        privacy = _privacy(epsilon, label_counts, config, steps, delta)
    out = check_out(Path(args.out) if args.out else _default_out(dataset, dpicl_home()))
    run_id = out.name
    request = _charge_request(config, dataset, run_id, privacy) if epsilon > 0 else None
    if request is not None:
        if math.isinf(epsilon):
            print(f"WARNING: --epsilon inf generates without noise (sigma = 0): charged to ledger id "
                  f"'{config.ledger_id}' as an infinite spend; the demos carry no privacy guarantee.",
                  file=sys.stderr, flush=True)
        Ledger().check_charge([request])  # BudgetExceededError (exit 3) here, in seconds
    check_max_tokens(config.max_tokens, context_length(config.model), config.model)
    lm = LanguageModel.load(config.model, config.device, config.dtype)
    validate_generation(gen_config, 0.0, lm.vocab_size)

    def progress(info: dict) -> None:  # public counters only (tokens/s depends on the records' lengths)
        report_progress(f"generate eps={args.epsilon:g}: token steps", info["step"], info["max_steps"])

    ledger_entry = None
    with stopping_on_signals(), showing_progress(not args.json):
        if epsilon == 0:  # instruction-only: reads no private record, charges nothing
            result = instruction_only_demos(lm, spec, labels, gen_config, seed=config.seed, progress=progress)
        else:
            # ---- PRIVACY LEDGER: the spend is charged (or refused, exit 3) BEFORE any private record is read.
            ledger_entry = Ledger().charge_many([request])[0].to_dict()
            records = {label: dataset.records_for(label) for label in labels}  # private: stays in memory
            result = generate_demos(lm, spec, records, gen_config, privacy["noise_multiplier"], seed=config.seed,
                                    labels=labels, progress=progress)
    frame = demos_frame(result.demos)
    empty = int((frame["tokens"] == 0).sum()) if "tokens" in frame else 0
    if empty:  # a DP output: the model ended the demo at its first token
        print(f"WARNING: {empty} of {len(frame)} demo(s) are empty (no token generated): they add nothing to a "
              "prompt; a larger epsilon, --top-k or another model may help", file=sys.stderr)
    write_table(frame, out / "demos.parquet")
    wall_seconds = time.perf_counter() - began
    private_out = private_dir() / "runs" / spec.name / dataset.content_hash[:12] / out.name
    write_json_atomic(private_out / "generation_stats.json",
                      jsonable({"run_id": run_id, "wall_seconds": wall_seconds, "stats": result.stats,
                                "private_stats": result.private_stats}))
    summary = {
        "run_id": run_id, "dataset": spec.name, "content_hash": dataset.content_hash, "model": config.model,
        **privacy, "seeded_noise": result.seeded_noise, "demos_per_label": per_label, "labels": labels,
        "config": gen_config.model_dump(), "stats": result.stats, "ledger_entry": ledger_entry,
        # Wall time depends on the records' lengths (a weak timing channel): whole seconds only.
        "wall_seconds": round(wall_seconds),
    }
    write_json_atomic(out / "generation.json", jsonable(summary))
    write_manifest(out, {"run_id": run_id, "kind": "generate"})
    if args.json:
        print_json({**summary, "out": str(out),
                    "demos": [{"label": d.label, "shot": d.shot, "text": d.text, "tokens": d.tokens,
                               "stop_reason": d.stop_reason, "method": d.method} for d in result.demos]})
        return 0
    eps_text = "inf" if math.isinf(privacy["epsilon"]) else f"{privacy['epsilon']:.3f}"
    print(f"epsilon {eps_text} (delta {privacy['delta']:.3g}), sigma {privacy['noise_multiplier']:.4f}, "
          f"q {privacy['sampling_rate']:.3g}, T {steps}, {config.mechanism}"
          + ("  [seeded noise: experiment only, not releasable]" if result.seeded_noise else ""))
    if config.delta is None and epsilon > 0:
        from flows.cli.run import delta_note

        print(delta_note(config, privacy["delta"]))
    for demo in result.demos:
        print(f"[{demo.label} #{demo.shot}] ({demo.tokens} tokens, {demo.stop_reason}) {demo.text}")
    print(f"{summary['wall_seconds']} s, {result.stats['steps']} steps, {result.stats['synthetic_tokens']} "
          f"synthetic tokens; wrote {out / 'demos.parquet'}")
    return 0
