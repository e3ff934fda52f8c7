"""CLI: `dpicl pate`, PromptPATE (Duan et al. Section 4.2) through the same flow and tasks the pipeline runs.

    dpicl pate --dataset sst2 --epsilon E [--preset auto|cpu|gpu --teachers 200 --shots 1 --public iid
               --queries 500 --threshold T --sigma1 S1 --sigma2 S2 --test-size N --vote-mode black-box
               --accounting data-independent|data-dependent --gnss-order L --gnss-beta B --gnss-sigma S
               --gnss-delta0 P] [--json]

The plan labels, per repeat, the most public queries whose data-independent epsilon (all repeats) stays within
E, at most --queries; the preset fills the flags left unset (Table 7 on a GPU, minutes on a CPU). With
--accounting data-dependent every query is labelled and the labelling is charged at a DP-released upper
bound on its data-dependent cost, up to E; the bound fails with probability --gnss-delta0 (default: half of
delta), which is part of delta (`dpcore.pate.released_cost`).

Before anything is written: every check (E*k within the private records, T in [0, E], sigmas > 0,
the public source non-empty, no public text in the private or test split, Q within the public set,
--test-size within the test split) and a dry run of the charge against the dataset's budget
(`BudgetExceededError`, exit 3). `--json` prints one object whose top-level keys are documented in
docs/json.md.
"""

from __future__ import annotations

import sys

from dpcore.config import RunConfig
from dpcore.display import fmt_delta, fmt_eps
from dpcore.flags import flag
from dpcore.public_outputs import Kind, declare, declare_line
from flows.cli import common as cli
from flows.cli.common import fmt_value as _fmt
from flows.cli.progress import showing_progress, stopping_on_signals

# RunConfig fields `dpicl pate` takes, and the short spellings of the PromptPATE ones.
FIELDS = [*cli.DATA_FLAGS, "delta", "seed", "test_size", "calibrate", "task_runner", "pate_teachers", "pate_shots", "pate_public_path",
          "pate_public_column", "pate_queries", "pate_threshold", "pate_sigma1", "pate_sigma2", "pate_vote_mode",
          "pate_repeats", "pate_student_candidates", "pate_baselines", "pate_teacher_block", "pate_preset",
          "pate_accounting", "pate_gnss_order", "pate_gnss_beta", "pate_gnss_sigma", "pate_gnss_delta0"]
# PromptPATE's public outputs (written by `flows.pate` and `tasks.pate`, this command's --json): the noisy labels,
# the answered counts, the students built from them and their accuracies are DP outputs; with data-dependent
# accounting so are the labelling's released RDP and every epsilon charged from it (a DP-released upper bound).
_PATE_DP = ("/accuracy", "/answered", "/baselines", "/student_prompt", "/student_prompts", "/checkpoints",
            "/epsilon", "/released_rdp", "/best_repeat")
declare("json:pate", Kind.DP, *_PATE_DP)
declare("json:pate", Kind.IDENTITY, "/data_hash")
declare("file:*pate_plan.json", Kind.DP, "/best_repeat", "/plan/epsilon", "/plan/parameters/released_rdp",
        "/plan/spends/*/event/**/epsilon", "/plan/spends/*/epsilon")
declare("file:*pate_plan.json", Kind.IDENTITY, "/data_hash")
for _output in ("file:*pate_noisy_labels.parquet", "file:*pate_students.parquet", "file:*pate_student.parquet"):
    declare(_output, Kind.DP, "/*")
declare("file:*pate_results.parquet", Kind.DP, "/*/epsilon", "/*/answered_mean")
declare("artifact:prompt-pate-results", Kind.DP, "/data/*/epsilon", "/data/*/answered_mean")
declare("file:cache/stages/pate-aggregate/*/prefect-result.json", Kind.DP, "/result/answered", "/result/released_rdp",
        "/result/**/answered", "/result/labelled")
declare("file:cache/stages/pate-student/*/prefect-result.json", Kind.DP, "/result/**/validation_accuracy",
        "/result/**/demos", "/result/**/candidates", "/result/**/accuracy")
declare_line(Kind.DP, r"^PromptPATE: answered (\[[^\]]*\]) of \d+ queries per repeat; student \S+ accuracy (\S+); "
                      r"epsilon (\S+)$")
declare_line(Kind.DP, r"^PromptPATE: \d+ queries, answered per repeat (\[[^\]]*\])")
declare_line(Kind.DP, r"^ledger \S+: PromptPATE labelling charged at the released upper bound .*: the run's "
                      r"PromptPATE epsilon (\S+) at delta")
ALIASES = {"pate_teachers": "--teachers", "pate_shots": "--shots", "pate_public_path": "--public-path",
           "pate_queries": "--queries", "pate_threshold": "--threshold", "pate_sigma1": "--sigma1",
           "pate_sigma2": "--sigma2", "pate_vote_mode": "--vote-mode", "pate_preset": "--preset",
           "pate_repeats": "--repeats", "pate_student_candidates": "--student-candidates",
           "pate_baselines": "--baselines", "pate_accounting": "--accounting", "pate_gnss_order": "--gnss-order",
           "pate_gnss_beta": "--gnss-beta", "pate_gnss_sigma": "--gnss-sigma", "pate_gnss_delta0": "--gnss-delta0"}


def _config(args) -> RunConfig:
    overrides = {"methods": ["pate"], "epsilons": [args.epsilon]}
    if args.public is not None:
        if args.public in ("iid", "ood", "file"):
            overrides["pate_public"] = args.public
        else:  # a path
            overrides.update(pate_public="file", pate_public_path=args.public)
    return cli.checked_config(args, **overrides)


def format_plan(plan) -> str:
    """PromptPATE's part of a run plan (its `method_plan("pate")`, a `tasks.pate.PatePlan`) in one line: flock,
    Confident-GNMax settings, queries per repeat and the epsilon charged before any teacher sees a query. Public:
    parameters only."""
    pate = plan.method_plan("pate")
    settings, charged = pate.settings, pate.plans[0]
    head = (f"PromptPATE plan ({settings['preset']} preset): E={settings['teachers']} teachers x {settings['shots']} "
            f"shot(s), T={settings['threshold']:g}, sigma1={settings['sigma1']:g}, sigma2={settings['sigma2']:g}; "
            f"{pate.per_repeat} queries x {settings['repeats']} repeat(s) (at most {settings['queries']} asked); ")
    if settings["accounting"] == "data-dependent":
        gnss = settings["gnss"]
        return head + (f"data-dependent accounting: the smooth-sensitivity release of an upper bound (order "
                       f"{gnss['order']:g}, beta {gnss['beta']:.3g}, sigma_ss {gnss['sigma_ss']:g}, failing with "
                       f"probability {fmt_delta(gnss['delta0'])}, part of delta) charged epsilon "
                       f"{fmt_eps(charged.parameters['epsilon_release'])} before any teacher sees a query, the "
                       f"labelling at that bound after it, up to epsilon {fmt_eps(charged.epsilon)} at delta "
                       f"{fmt_delta(plan.delta)} (over it, nothing is published; the data-independent bound would be "
                       f"{fmt_eps(charged.parameters['epsilon_data_independent'])})")
    return head + (f"charged epsilon {fmt_eps(charged.epsilon)} at delta {fmt_delta(plan.delta)} (data-independent) "
                   "before any teacher sees a query")


def format_summary(summary: dict) -> str:
    accuracy = summary["accuracy"]
    # the summary's accuracies are the calibrated ones when the run calibrates (--calibrate, the default)
    which = "calibrated accuracy" if accuracy.get("calibrated", True) else "raw accuracy"
    lines = [
        f"PromptPATE on {summary['dataset']}: E={summary['teachers']} teachers x {summary['shots']} shot(s), "
        f"T={summary['threshold']:g}, sigma1={summary['sigma1']:g}, sigma2={summary['sigma2']:g}, "
        f"votes {summary['vote_mode']}, public {summary['public']}",
        f"queries {summary['queries']} per repeat; answered {summary['answered']}",
        f"student {which} {_fmt(accuracy['mean'])} +/- {_fmt(accuracy['std'])} over {len(accuracy['per_repeat'])} "
        f"repeat(s), {accuracy['n']} test items",
        *[f"baseline {name}: {which} {_fmt(value)}" for name, value in summary["baselines"].items()],
        f"epsilon {fmt_eps(summary['epsilon'])} (charged, {summary.get('accounting', 'data-independent')}, all "
        f"repeats) at delta "
        f"{fmt_delta(summary['delta'])}",
        "student prompt: " + " | ".join(f"{d['text']!r} -> {d['label']}" for d in summary["student_prompt"]),
        f"noise: {'FIXED SEED (experiment, never releasable)' if summary['seeded_noise'] else 'cryptographically seeded'}",
        f"run id: {summary['run_id']}    artifact folder: {summary['run_dir']}",
    ]
    return "\n".join(lines)


def _pate(args) -> int:
    # Prefect, dp-accounting load here, not for `dpicl --help`
    from flows.pate import pate_flow
    from tasks.run_plans import build_run_plan

    config = _config(args)
    # every check and the budget's dry run before a file is written or a model loads (over budget: exit 3)
    plan = build_run_plan(config, methods=("pate",))
    plan.dry_run(args.run_id)
    print(format_plan(plan), file=sys.stderr, flush=True)
    if len(plan.method_plan("pate").plans) > 1:
        print(f"WARNING: non-private PromptPATE baseline(s) {', '.join(sorted(set(config.pate.baselines) - {'zero-shot'}))} "
              f"requested: teacher prompts (real private records) on the test split, charged to ledger id "
              f"'{config.ledger_id}' as an infinite spend (epsilon = inf)", file=sys.stderr, flush=True)
    # no wall time: the teachers' votes take time that depends on their private records' lengths
    with stopping_on_signals(), showing_progress():
        summary = pate_flow(config=config, run_id=args.run_id, plan=plan)
    if args.json:
        cli.print_json(summary)
    else:
        print(format_summary(summary))
    return 0


def register(subparsers) -> None:
    parser = cli.command(
        subparsers, "pate", _pate, help="PromptPATE: a private discrete prompt from a flock of teacher prompts (Duan et al.)",
        description="PromptPATE (Duan et al. Section 4.2): E teacher prompts from disjoint private records vote on "
                    "public queries; Confident-GNMax labels them privately; the best student prompt of labelled "
                    "public queries is evaluated on the test split. The ledger is charged before any teacher "
                    "sees a query.")
    parser.add_argument("--epsilon", type=cli.parse_epsilon, required=True,
                        help="PromptPATE's epsilon over all repeats (> 0; inf: every --queries query, charged at "
                             "its data-independent bound): each repeat labels the most queries it affords, at "
                             f"most --queries (the same as {flag('pate_target_epsilon')} in dpicl run)")
    cli.add_config_flags(parser, FIELDS, aliases=ALIASES)
    parser.add_argument("--public", default=None, metavar="iid|ood|PATH",
                        help="public queries: iid (the task's public split), ood (the task YAML's OOD dataset) or a "
                             "CSV/JSONL/Parquet file with a text column (default: iid)")
    cli.add_output_flags(parser, run_id=True, json_help="print one JSON object (its keys: docs/json.md)")



