"""CLI: `dpicl run` (the whole pipeline) and `dpicl demo` (the same, sized for a CPU).

`dpicl run` takes every RunConfig field as a flag (`--num-subsets`, `--max-tokens`, `--shots`,
`--test-size`, ...: the generation flags of `dpicl generate` and the evaluation flags of
`dpicl evaluate`, same names) and runs the Prefect flow in this process. Without
PREFECT_API_URL, Prefect starts a temporary local server on the SQLite database under
$DPICL_HOME/prefect (the same database `dpicl ui` serves, so past runs show up there).
"""

from __future__ import annotations

import argparse
import sys

from dpcore.audit.config import AuditConfig
from dpcore.config import RunConfig
from dpcore.display import fmt_delta, fmt_eps
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.lm.runtime import minutes_text
from dpcore.names import PREDICTION_METHODS
from dpcore.public_outputs import Kind, declare, declare_line
from dpcore.report.summary import verdict_line
from flows.cli.common import (
    add_config_flags,
    checked_config,
    command,
    parse_epsilon,
    print_json,
)
from flows.cli.common import fmt_value as _fmt
from flows.cli.pate import format_plan as format_pate_plan
from flows.cli.progress import showing_progress, stopping_on_signals

# `dpicl demo`: the three private-prompting methods on AG News at epsilon 8 on the embedded SmolLM2-135M,
# about 15 minutes on 2 CPU cores (measured, with a fresh home: README.md).
DEMO_DEFAULTS = {
    "methods": "tang,pate,dpsgd",
    "dataset": "agnews",
    "epsilons": "8",
    # DP few-shot generation (Tang et al.)
    "num_subsets": 3,      # M
    "subset_size": 1,      # N (q = MN/|D_y| = 3/30000)
    "top_k": 100,          # K (RVP on)
    "max_tokens": 20,      # T_max
    "shots": 4,            # one demo per label
    "seeds": 2,
    "test_size": 100,
    "audit": True,
    # The audit of the run's own DP demos (members: the private split they were generated from;
    # non-members: held-out test records): nothing regenerated or charged. Sized as a run sizes it (the
    # fewest records that detect the default leak: 4 demos x 7 trials of 2 members vs 2 non-members), each
    # candidate's first 12 tokens, the three attacks without OUT prompts (LiRA needs extra passes).
    "audit_mode": "run-demos",
    "audit_reference_prompts": 0,
    "audit_max_record_tokens": 12,
    # ... and, for contrast, the non-private reference audit (real records as 1-shot demos: Duan et al.'s
    # leaky setting), an infinite spend like the non-private baselines below.
    "audit_reference": True,
    # PromptPATE (Duan et al. Section 4.2): a flock of 10 one-shot teachers on the public split's queries,
    # labelling until the run's epsilon 8 is reached (sigma1 = 5, the AG News YAML's, sigma2 = 3: 10 queries).
    "pate_teachers": 10,
    "pate_queries": 20,
    "pate_sigma1": 5.0,
    "pate_sigma2": 3.0,
    "pate_repeats": 1,
    "pate_student_candidates": 5,
    "pate_baselines": "zero-shot",
    # The release audits of PromptPATE's student and PromptDPSGD's prompt are their own designs on their own
    # pools (about 2.5 more minutes): `dpicl release --audit-only` runs them.
    "audit_methods": False,
    # PromptDPSGD (Duan et al. Section 4.1): the CPU preset's recipe (10 positions from the instruction, lr 0.3)
    # on a fifth of its compute: 20 DP-SGD steps of expected batch 32 (640 examples, about 5 minutes on AG News),
    # its loss curve on 32 public examples. More, smaller steps are what the preset's choice on public data
    # favoured at a fixed compute.
    "dpsgd_steps": 20,
    "dpsgd_batch_size": 32,
    "dpsgd_validation_size": 32,
    "seed": None,          # cryptographically seeded noise (a real run)
    # AG News is a shipped public benchmark: the demo opts in to a non-private baseline for contrast, real
    # records as demos (charged to ledger id agnews as an infinite spend). `dpicl run` includes it only when
    # asked. The other references of Tang et al. Table 1 (instruction-only, sigma = 0) are in
    # benchmarks/reproduce_tables.py.
    "baselines": "zero-shot,random-real",
}
DEMO_BASELINES_NOTE = ("demo: AG News is a public benchmark, so the demo opts in to the non-private baselines "
                       "{baselines} for contrast; `dpicl run` on your own data runs them only when asked "
                       "(--baselines sigma-zero,random-real, --audit-reference).")


def _config_fields() -> list[str]:
    return list(RunConfig.flat_names())


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, _config_fields())
    parser.add_argument("--epsilon", dest="epsilon_single", action="append", default=None, metavar="E",
                        type=parse_epsilon,
                        help="one epsilon (repeatable; same as --epsilons E1,E2; `inf` = sigma 0, 0 = instruction-only)")
    parser.add_argument("--run-id", default=None, help="name of the run folder (default: <UTC start>-<flow run id>)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--yes", action="store_true",
                        help="run a multi-method plan without asking for confirmation on a terminal")


# `dpicl run --json`: the rows of every method (accuracies of DP prompts on test items, the epsilon charged: public
# counts, or PromptPATE's DP-released bound), the methods' summaries (their own declarations apply inside them),
# the audits' verdicts, the records' keyed content hash.
declare("json:run", Kind.DP, "/results/*/accuracy*", "/results/*/calibrated_accuracy*", "/results/*/epsilon",
        "/private_data_verdict/**/accuracy", "/private_data_verdict/**/zero_shot_calibrated",
        "/private_data_verdict/**/difference", "/private_data_verdict/**/standard_error",
        "/private_data_verdict/**/verdict", "/private_data_verdict/**/method", "/private_data_verdict/**/scoring",
        "/method_summaries/**/accuracy*", "/method_summaries/**/calibrated_accuracy*",
        "/method_summaries/pate/**/answered*", "/method_summaries/pate/**/student_prompt*",
        "/method_summaries/pate/**/validation_accuracy", "/method_summaries/pate/**/best_repeat",
        "/method_summaries/pate/**/per_repeat", "/method_summaries/pate/baselines/*",
        "/method_summaries/pate/**/epsilon", "/method_summaries/pate/released_rdp",
        "/method_summaries/dpsgd/prompts/*/curve/*/val_loss")
declare("json:run", Kind.COUNT, "/results/*/noise_multiplier", "/results/*/sampling_rate",
        "/method_summaries/dpsgd/**/noise_multiplier", "/method_summaries/dpsgd/**/sampling_rate",
        "/method_summaries/dpsgd/**/epochs", "/method_summaries/dpsgd/**/training_records",
        "/method_summaries/dpsgd/prompts/*/curve/*/epsilon", "/method_summaries/dpsgd/results/*/epsilon")
declare("json:run", Kind.VERDICT, "/results/*/audit", "/audit/**", "/method_audits/*/verdict",
        "/method_audits/*/passed")
declare("json:run", Kind.IDENTITY, "/data_hash", "/method_summaries/*/data_hash")
# after a run that did not pay: what PromptDPSGD would take on these records (public sizes and counts)
declare_line(Kind.COUNT, r"^a trained soft prompt is what pays on a small local model: .* is (about .*) here")
# the plan said before anything runs: what the accountant composes from the public counts
# (the greedy group takes the estimated minutes too: from public sizes and counts)
declare_line(Kind.COUNT, r"^plan: epsilon (\S+) at delta \S+, composed over every spend of the run \((.*)\)")


def _config(args, defaults: dict | None = None) -> RunConfig:
    """RunConfig from the flags; `defaults` (the demo's) apply to the fields not given on the command line."""
    explicit = {name for name in _config_fields() if getattr(args, name, None) is not None}
    overrides = {k: v for k, v in (defaults or {}).items() if k not in explicit}
    if args.epsilon_single:
        overrides["epsilons"] = list(args.epsilon_single)
    return checked_config(args, **overrides)


def format_results(summary: dict) -> str:
    """The results table: one line per (method, epsilon)."""
    header = (f"{'method':<17} {'epsilon':>7} {'sigma':>7} {'raw accuracy':>15} {'calibrated accuracy':>19} "
              f"{'audit':>12}")
    lines = [header, "-" * len(header)]
    for row in summary["results"]:
        eps = row["epsilon"]
        line = (
            f"{row['method']:<17} {fmt_eps(eps):>7} {_fmt(row.get('noise_multiplier'), '.3f'):>7} "
            f"{_fmt(row['accuracy_mean']) + ' +/- ' + _fmt(row['accuracy_std']):>15} "
            f"{_fmt(row['calibrated_accuracy_mean']) + ' +/- ' + _fmt(row['calibrated_accuracy_std']):>19} "
            f"{row.get('audit') or '-':>12}"
        )
        lines.append(line)
    verdict = summary["audit"]
    ledger_line = format_ledger(summary.get("ledger_after"))
    if not verdict.get("ran"):
        audit_line = "audit: not run"
    else:
        audit_line = "audit: " + ("PASSED" if verdict.get("passed") else "FAILED")
        audit_line += "".join(f"\n  - {reason}" for reason in verdict.get("reasons", []))
        reference = verdict.get("reference")
        if reference:
            audit_line += f"\n  contrast, real records as demos (non-private): {reference.get('verdict')}"
        audit_line += ("\n  (the audit's figures are statistics of private records: the private run folder's "
                       "audit.parquet, never published)")
    n = summary["results"][0]["n"] if summary["results"] else 0
    seeds = summary["results"][0].get("seeds") if summary["results"] else 0
    over = f"{seeds} seed(s)" if seeds else "seeds, repeats or trainings"
    lines += [
        f"(accuracies: mean +/- std over {over}, {n} test items; delta = {fmt_delta(summary['delta'])})",
        audit_line,
        *([ledger_line] if ledger_line else []),
        *([summary["delta_note"]] if summary.get("delta_note") else []),
        f"noise: {'FIXED SEED (experiment, never releasable)' if summary['seeded_noise'] else 'cryptographically seeded'}",
        f"run id:          {summary['run_id']}",
        f"MLflow run id:   {summary['mlflow_run_id']}  ({summary['tracking_uri']})",
        f"artifact folder: {summary['run_dir']}",
    ]
    return "\n".join(lines)


def format_ledger(report: dict | None) -> str | None:
    """`ledger: dataset X spent epsilon E at delta D (N entries this run: ...; M in total)` after the run."""
    if not report:
        return None
    line = (f"ledger: dataset {report['dataset_id']} spent epsilon {fmt_eps(report['epsilon'])} at delta "
            f"{fmt_delta(report['delta'])} ({report['entries_this_run']} entries this run"
            + (f": {', '.join(report['purposes_this_run'])}" if report.get("purposes_this_run") else "")
            + f"; {report['entries_total']} in total, composed)")
    budget = report.get("budget")
    if budget:
        line += f"; budget epsilon {fmt_eps(budget['epsilon'])} at delta {fmt_delta(budget['delta'])}"
    return line


def delta_note(config: RunConfig, delta: float, records: int | None = None) -> str | None:
    """What delta means for this run, in records: a mechanism at delta may fail outright with probability
    delta, which over |D| records is delta * |D| records' worth of exposure. The default delta = 1/|D| (the
    papers' choice, kept for comparability) covers one whole record: said with the flag that changes it."""
    records = records if records is not None else (round(1.0 / delta) if config.delta is None else None)
    if config.delta is not None:
        if records is None:
            return None
        return (f"note: delta = {fmt_delta(delta)} covers delta x |D| = {delta * records:.3g} record(s) of the "
                f"{records}")
    return (f"note: delta = 1/|D| = {fmt_delta(delta)} covers delta x |D| = 1 record of the {records} (the papers' default, "
            "kept for comparability): pass --delta, e.g. 1/(100|D|), for a guarantee that covers 0.01 records")


def _before_run(config: RunConfig, run_id: str | None, defaults: dict | None, confirm: bool = False):
    """What is said and checked before the pipeline starts, on the run's one plan (`tasks.run_plans.RunPlan`,
    built here and handed to the flow): the non-private baselines the run will spend (a warning line), every
    check on the data, the planned cost of every method the run names (composed as the ledger composes it;
    printed when the run names several, and confirmed on a terminal when `confirm`), the audit's design (what
    it runs, and why it would not conclude), and a dry run of the charge against the dataset's budget (a
    refusal comes here, before any model loads). Returns the plan."""
    # dp-accounting loads here, not for `dpicl --help`
    from tasks.charge import non_private_baselines, non_private_warning, planned_cost
    from tasks.run_plans import build_run_plan

    chosen = non_private_baselines(config)
    if defaults is DEMO_DEFAULTS and chosen:
        print(DEMO_BASELINES_NOTE.format(baselines=" and ".join(chosen)), file=sys.stderr)
    warning = non_private_warning(config)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    plan = build_run_plan(config)
    spends = plan.spends(run_id)
    # first: what the run will spend (every spend composed, a regenerate-mode audit's among them) and take
    print(format_cost(planned_cost(spends), plan.estimated_seconds()), file=sys.stderr, flush=True)
    if plan.audit is not None:  # the audit planned from public counts, said before it runs
        from tasks.audit import design_line

        if plan.audit.config is not None:
            print(design_line(plan.audit.config, plan.audit.design, plan.audit.demo_sets), file=sys.stderr,
                  flush=True)
        if plan.audit.note:
            print(plan.audit.note, file=sys.stderr, flush=True)
        holdout = plan.config.audit_holdout_fraction
        if holdout is not None:  # where its non-members come from, with a test file that need not be like them
            print(f"audit: its non-members are {holdout:.0%} of the private file held out by a keyed hash of each "
                  f"record's id ({flag('audit_holdout', holdout)}), read by no method; the test file only "
                  "evaluates", file=sys.stderr, flush=True)
    if plan.method_plan("pate") is not None:
        print(format_pate_plan(plan), file=sys.stderr, flush=True)
    plan.dry_run(run_id)  # over budget: BudgetExceededError; records another dataset id spends on: SameRecordsError
    if confirm and not _confirmed():
        raise ConfigError("run: not confirmed; nothing was charged (pass --yes to run without asking)")
    return plan


def format_cost(cost: dict, seconds: float | None = None) -> str:
    """`plan: epsilon E at delta D, composed over every spend of the run (tang 1.2, audit 3.4); about 7 minutes
    (estimated from public sizes); charged to the ledger, all at once, before anything runs`. A run that reads
    no private record: `plan: nothing charged ...`."""
    took = f"; {minutes_text(seconds)} (estimated from public sizes)" if seconds is not None else ""
    if cost["delta"] is None:
        return f"plan: nothing charged (no private record read){took}"
    per_method = ", ".join(f"{method} {fmt_eps(eps)}" for method, eps in cost["methods"].items())
    return (f"plan: epsilon {fmt_eps(cost['epsilon'])} at delta {fmt_delta(cost['delta'])}, composed over "
            f"every spend of the run ({per_method}){took}; charged to the ledger, all at once, before anything "
            "runs")


def _confirmed() -> bool:
    print("spend this privacy budget and run? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _run(args, defaults: dict | None = None) -> int:
    config = _config(args, defaults)
    # A multi-method run on a terminal asks before spending; scripts pass --yes (--json never asks).
    confirm = (len(config.methods) > 1 and not args.yes and not args.json and defaults is not DEMO_DEFAULTS
               and sys.stdin.isatty())
    plan = _before_run(config, args.run_id, defaults, confirm=confirm)
    # The flow (Prefect, MLflow, the model's stack) loads here: not for `dpicl --help`, nor for a refusal above
    from flows.pipeline import run_pipeline

    # no wall time: generation, teacher votes and training take time that depends on the private records
    with stopping_on_signals(), showing_progress():
        summary = run_pipeline(config, run_id=args.run_id, plan=plan)
    summary["delta_note"] = delta_note(config, float(summary["delta"]))
    if args.json:
        print_json(summary)
    else:
        print(format_results(summary))
        print(format_next(summary))
        paid = verdict_line(summary.get("private_data_verdict"))
        if paid:  # last: the answer to "was it worth it"
            print(paid)
            pays = trained_prompt_line(config, summary.get("private_data_verdict"))
            if pays:
                print(pays)
    return 0


def trained_prompt_line(config: RunConfig, verdict: dict | None) -> str | None:
    """After a run whose prompts did not clearly pay and that trained none: the method that pays on the
    embedded model (a PromptDPSGD soft prompt, README), with what it would take on these records at the run's
    first epsilon (`tasks.run_plans`: the CPU preset's work from public sizes; nothing is charged)."""
    if "dpsgd" in config.methods or not verdict or all(v["verdict"] == "paid" for v in verdict["epsilons"]):
        return None
    from tasks.run_plans import build_run_plan  # dp-accounting: only after a run that did not pay

    epsilon = next((e for e in config.epsilons if 0 < e < float("inf")), None)
    if epsilon is None:
        return None
    try:
        plan = build_run_plan(config.with_updates(methods=["dpsgd"], epsilons=[epsilon], audit=False))
    except ConfigError:  # a setting PromptDPSGD does not take on these records: no estimate to give
        return None
    took = minutes_text(plan.estimated_seconds())
    return (f"a trained soft prompt is what pays on a small local model: `dpicl run --methods dpsgd --epsilons "
            f"{fmt_eps(epsilon)}` on these records is {took} here (estimated from public sizes), its prompt released, "
            "audited and used by `dpicl predict` like demos (docs/promptdpsgd.md)")


def format_next(summary: dict) -> str:
    """Where to look next: the UIs, the run folder, the audited release."""
    audited = {a["method"] for a in summary.get("method_audits") or []}
    # a prediction method's product is its answers (in the run folder): no prompt to release or audit
    methods = [m for m in summary.get("methods") or ["tang"] if m not in PREDICTION_METHODS]
    # every method but tang (whose demos the run audits itself) is audited at its release
    unaudited = [m for m in methods if m != "tang" and m not in audited]
    # `dpicl release --audit-only` audits with AuditConfig's defaults, members capped by the mechanism
    trials, members = AuditConfig.model_fields["trials"].default, AuditConfig.model_fields["members"].default
    return "\n".join([
        "next:",
        "  dpicl ui                                 # Prefect (http://127.0.0.1:4200): this flow run, its "
        "artifacts; MLflow (http://127.0.0.1:5000): its runs",
        f"  ls {summary['run_dir']}   # tables, plots, manifest.json",
        *([f"  dpicl release --run {summary['run_id']}"
           + (f" [--method {'|'.join(methods)}]" if len(methods) > 1
              else f" --method {methods[0]}" if methods != ["tang"] else "")
           + "   # the audited release (refused for a seeded run or a failed audit)"] if methods else []),
        *([f"  dpicl release --run {summary['run_id']} --method {'|'.join(unaudited)} --audit-only"
           f"   # the membership audit of that method's prompt ({trials} trials; members: at most {members}, and "
           "no more than the records its mechanism read)"] if unaudited else []),
        f"  dpicl ledger show --dataset {(summary.get('ledger') or {}).get('dataset_id', summary['dataset'])}",
    ])


def _demo(args) -> int:
    return _run(args, DEMO_DEFAULTS)


def register(subparsers) -> None:
    run = command(subparsers, "run", _run,
                  help="run the whole pipeline (generate, evaluate, audit, record) as a Prefect flow",
                  description="Run the DP few-shot pipeline as a Prefect flow. Every RunConfig field is a "
                              "flag (--epsilons 1,4 --num-subsets 10 --shots 4 --test-size 300 ...).")
    _add_run_flags(run)

    demo = command(
        subparsers, "demo", _demo, help="the pipeline on the embedded model and AG News: about 15 minutes on 2 CPU cores (measured)",
        description="dpicl run with demo defaults: " + ", ".join(f"{k}={v}" for k, v in DEMO_DEFAULTS.items())
        + ". Any flag of dpicl run overrides them.")
    _add_run_flags(demo)

