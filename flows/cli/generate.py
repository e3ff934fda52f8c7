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
printed or written there. Counters that depend on the private records (prompt/forward/padded
tokens, prompts, the wall time and its phases, tokens/s) go to
`generation_stats.json` under `$DPICL_HOME/private/runs/<dataset>/<hash12>/<out folder name>/`.
"""

from __future__ import annotations

from pathlib import Path

from dpcore.display import fmt_delta, fmt_eps, fmt_sigma, steps_text
from flows.cli import common as cli
from flows.cli.progress import showing_progress, stopping_on_signals
from flows.cli.run import delta_note

CONFIG_FLAGS = [*cli.DATA_FLAGS, "delta", *cli.GENERATION_FLAGS, "seed", "shots"]


def register(subparsers) -> None:
    parser = cli.command(
        subparsers, "generate", run_generate, help="calibrate sigma and generate DP synthetic demonstrations (Algorithm 1)",
        description="Generate differentially private synthetic demonstrations (Tang et al. Algorithm 1) and "
        "write the demos Parquet. Prints only synthetic (DP) text and public configuration.")
    parser.add_argument("--epsilon", type=cli.parse_epsilon, required=True,
                        help="target epsilon; 'inf' = sigma 0 (no noise); 0 = instruction-only (no private data)")
    cli.add_config_flags(parser, CONFIG_FLAGS)
    cli.add_output_flags(parser, out=True)


def _config(args):
    return cli.checked_config(args, epsilons=[args.epsilon])


def run_generate(args) -> int:
    # Prefect, dp-accounting load here, not for `dpicl --help`
    from flows import standalone

    config = _config(args)
    with stopping_on_signals(), showing_progress(not args.json):
        summary, demos = standalone.generate(config, float(args.epsilon), Path(args.out) if args.out else None, cli.say)
    if args.json:
        cli.print_json({**summary, "demos": [{"label": d.label, "shot": d.shot, "text": d.text, "tokens": d.tokens,
                                          "stop_reason": d.stop_reason, "method": d.method} for d in demos]})
        return 0
    print(f"epsilon {fmt_eps(summary['epsilon'])} (delta {fmt_delta(summary['delta'])}), sigma "
          f"{fmt_sigma(summary['noise_multiplier'])}, q {summary['sampling_rate']:.3g}, "
          f"{steps_text(summary['steps'], summary['config']['max_tokens'])}, {config.mechanism}"
          + ("  [seeded noise: experiment only, not releasable]" if summary["seeded_noise"] else ""))
    if config.delta is None and args.epsilon > 0:
        print(delta_note(config, summary["delta"]))
    for demo in demos:
        print(f"[{demo.label} #{demo.shot}] ({demo.tokens} tokens, {demo.stop_reason}) {demo.text}")
    print(f"{summary['stats']['steps']} steps, {summary['stats']['synthetic_tokens']} "
          f"synthetic tokens; wrote {Path(summary['out']) / 'demos.parquet'}")
    return 0
