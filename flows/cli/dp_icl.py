"""CLI: `dpicl dp-icl`, private prediction by DP-ICL (Wu et al. 2024): a noisy vote of exemplar-subset prompts.

    dpicl dp-icl --dataset sst2 (--epsilon E | --noise-multiplier S | both) [--queries Q]
                 [--queries-file FILE.jsonl] [--subsets 10 --shots 4 --queries-per-draw 1 --vote-mode calibrated]
                 [--max-keywords 4] [--model smollm2-135m] [--seed N] [--json]

Before anything is charged it says how many queries the budget affords (`queries_within` at the plan's noise);
then the whole plan is charged to the ledger (`tasks.charge`, refused over the dataset's budget: exit 3), and
only then are the queries (the dataset's test items, or the `text` of each line of --queries-file) answered.
Labelled queries (a test item, or a line with a `label`) are scored (an extraction task's answers, the keywords
of the query a noisy majority of subsets name, by exact match). Only the released answers and public parameters
are printed or written (`<run folder>/dp_icl.json`); the run's secret subset key stays in its private
folder. `--json` prints one object: its keys are in docs/methods/dp-icl.md.

DP-ICL as an endpoint also fills the hook point of `dpicl serve` and `dpicl predict` (`flows.cli.private_prediction`):

    dpicl serve --private --dataset sst2 (--epsilon E | --noise-multiplier S | both) [--queries Q] [...]
    dpicl predict --private --endpoint http://127.0.0.1:8000/v1 --input QUERIES.jsonl [--batch-size B] [--out FILE]

`serve --private` serves DP-ICL private prediction (`dpcore.dp_icl.server`): each request's batch of queries is
charged to the ledger before it is answered by the noisy vote of private exemplar subsets; the queries the budget
affords are said when it starts, and a batch beyond them is refused (HTTP 429), nothing charged. `predict
--private` sends a file's queries to such a server, batch by batch, and writes the labels it answers as JSONL.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from dpcore.data.artifacts import write_json_atomic, write_text_atomic
from dpcore.display import fmt_delta, fmt_eps
from dpcore.dp_icl.server import MAX_BATCH, create_private_app, request_answers
from dpcore.errors import ConfigError, DataValidationError
from flows.cli import common as cli
from flows.cli import private_prediction

# RunConfig fields the private commands take: where the records are, whose budget they spend, the model, the seed
FIELDS = [*cli.DATA_FLAGS, "delta", "seed"]
SERVE_FIELDS = [f for f in FIELDS if f not in ("model", "device")]  # serve has its own --model, --device
# serve's flags that apply to --private only (named when given without it)
SERVE_ONLY = ("epsilon", "noise_multiplier", "queries", "subsets", "shots", "queries_per_draw", "vote_mode",
              *SERVE_FIELDS)
JSON_KEYS = ("method", "run_id", "dataset", "dataset_id", "data_hash", "epsilon", "delta", "subsets", "shots",
             "noise_multiplier", "noise_std", "sampling_rate", "queries", "queries_per_draw", "queries_affordable",
             "records", "vote_mode", "aggregation", "max_keywords", "answers", "accuracy", "labelled", "correct",
             "ledger", "seeded_noise", "run_dir")


def positive_epsilon(text: str) -> float:
    """--epsilon: a finite number > 0 (a refusal is argparse's one line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def add_private_flags(parser: argparse.ArgumentParser, *, config_fields: list[str] = FIELDS) -> None:
    """The flags of a DP-ICL run: the budget (epsilon and/or noise multiplier, queries) and the ensemble."""
    group = parser.add_argument_group("DP-ICL (Wu et al. 2024): the budget and the ensemble")
    group.add_argument("--epsilon", type=positive_epsilon, default=None,
                       help="the budget of the answers (> 0); with --noise-multiplier: the queries it affords")
    group.add_argument("--noise-multiplier", type=positive_epsilon, default=None, metavar="SIGMA",
                       help="the query noise multiplier sigma (vote noise std sigma*sqrt(2)); default: calibrated "
                            "to --epsilon for --queries")
    group.add_argument("--queries", type=positive_int, default=None,
                       help="how many queries to plan for (default: the preset's, or all the budget affords with "
                            "both --epsilon and --noise-multiplier)")
    group.add_argument("--subsets", type=positive_int, default=None, help="M disjoint exemplar subsets (default 10)")
    group.add_argument("--shots", type=positive_int, default=None, help="k exemplars per subset prompt (default 4)")
    group.add_argument("--queries-per-draw", type=positive_int, default=None,
                       help="B queries sharing one subsample (default 1, the paper)")
    group.add_argument("--vote-mode", choices=("calibrated", "black-box"), default=None,
                       help="subset votes: calibrated label probabilities (default) or the greedy token")
    group.add_argument("--max-keywords", type=positive_int, default=None, metavar="K",
                       help="extraction tasks: most of the query's words one subset's answer votes for (default 4; "
                            "noise std sigma*sqrt(2K))")
    group.add_argument("--preset", choices=("auto", "cpu", "gpu"), default="auto",
                       help="the preset filling unset ensemble flags (default auto: gpu on a CUDA device)")
    cli.add_config_flags(parser, config_fields)


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-dp-icl-{uuid.uuid4().hex[:8]}"


def prepare(args, *, queries: int | None = None):
    """(config, settings, data): the configuration, the ensemble's settings and the loaded records, every check
    on public values made before the records are read."""
    from tasks.dp_icl import device_type, settings
    from tasks.ingest import load_data

    config = cli.checked_config(args)
    if args.epsilon is None and args.noise_multiplier is None:
        raise ConfigError("give --epsilon or --noise-multiplier (or both)")
    chosen = settings(args.preset, device_type(config.device), subsets=args.subsets, shots=args.shots,
                      queries_per_draw=args.queries_per_draw, vote_mode=args.vote_mode,
                      max_keywords=args.max_keywords)
    return config, chosen, load_data(config)


def _read_queries(path: str, labels: list[str] | None) -> tuple[list[str], list[str | None], list[dict]]:
    """(texts, labels or None, the other fields) of a JSONL file: a non-empty `text` per line, an optional
    `label` among the task's labels (`labels` None: any answer, an extraction task's)."""
    file = Path(path)
    if not file.is_file():
        raise DataValidationError(f"--queries-file {path}: file not found")
    texts, gold, extra = [], [], []
    for row in cli.read_queries(path):  # a non-empty `text` on every line
        line, text = row.pop("line"), row.pop("text")
        label = row.pop("label", None)
        if label is not None and labels is not None and str(label) not in labels:
            raise DataValidationError(f"{path}: line {line}: label {label!r} is none of {', '.join(labels)}")
        texts.append(text)
        gold.append(None if label is None else str(label))
        extra.append(row)
    if not texts:
        raise DataValidationError(f"--queries-file {path}: no query")
    return texts, gold, extra


def _dp_icl(args) -> int:
    from tasks.dp_icl import answers_public, is_correct, open_run, test_queries

    config, chosen, data = prepare(args)
    if args.queries_file is not None:
        # an extraction task's "labels" are its records' answers: private, never listed in a message
        texts, gold, extra = _read_queries(args.queries_file,
                                           data.labels if data.spec.kind == "classification" else None)
        from_file = True
    else:  # the dataset's test items: private rows, so only their position and answer are printed
        texts, gold = test_queries(data)
        extra, from_file = [{} for _ in texts], False
        if not texts:
            raise ConfigError("dp-icl: the dataset has no test item to answer; pass --queries-file")
    if args.queries is not None and args.queries > len(texts):
        raise ConfigError(f"--queries {args.queries}: only {len(texts)} queries to answer")
    run_id = args.run_id or new_run_id()
    budget, answerer, paths = open_run(config, chosen, data, epsilon=args.epsilon,
                                       noise_multiplier=args.noise_multiplier, queries=args.queries,
                                       limit=len(texts), run_id=run_id, announce=lambda b: cli.say(b.line()))
    wanted = budget.queries
    texts, gold, extra = texts[:wanted], gold[:wanted], extra[:wanted]
    result = answerer.answer(texts)  # charged first, then answered
    answers = result["answers"]
    p = budget.plan.parameters
    scored = [(a, g) for a, g in zip(answers, gold, strict=True) if g is not None]
    correct = sum(is_correct(a, g, p["aggregation"]) for a, g in scored)
    summary = {
        "method": "dp-icl", "run_id": run_id, "dataset": data.spec.name, "dataset_id": config.ledger_id,
        "data_hash": data.content_hash, "epsilon": budget.plan.epsilon, "delta": budget.plan.delta,
        **{k: p[k] for k in ("subsets", "shots", "noise_multiplier", "noise_std", "sampling_rate", "queries",
                             "queries_per_draw", "records", "aggregation", "max_keywords")},
        "queries_affordable": budget.affordable, "vote_mode": chosen.vote_mode,
        "answers": [{**({"line": i + 1} if from_file else {"test_item": i}), **extra[i], "label": answers[i]}
                    for i in range(len(answers))],
        "accuracy": correct / len(scored) if scored else None, "labelled": len(scored), "correct": correct,
        "ledger": result["ledger"], "seeded_noise": config.seed is not None, "run_dir": str(paths.public),
    }
    if not (from_file or answers_public(p["aggregation"])):  # words of private test items: the private folder
        private = write_json_atomic(paths.private / "dp_icl_answers.json", {"answers": summary["answers"]})
        summary.update(answers=[], private_answers=str(private))
    write_json_atomic(paths.public / "dp_icl.json", {k: v for k, v in summary.items() if k != "run_dir"})
    if args.json:
        cli.print_json(summary)
        return 0
    if summary.get("private_answers"):
        print(f"answers (words of the private test items): {summary['private_answers']}")
    for row in summary["answers"]:
        where = f"line {row['line']}" if from_file else f"test item {row['test_item']}"
        shown = "(other)" if row["label"] is None else row["label"] or "(no keyword)"
        print(f"{where}: {shown}")
    accuracy = "-" if summary["accuracy"] is None else f"{summary['accuracy']:.3f}"
    print(f"DP-ICL answered {len(answers)} queries at epsilon {fmt_eps(budget.plan.epsilon)}, delta "
          f"{fmt_delta(budget.plan.delta)} (charged before answering); accuracy {accuracy} on {len(scored)} "
          f"labelled")
    print(f"noise: {'FIXED SEED (experiment, never releasable)' if config.seed is not None else 'cryptographically seeded'}")
    print(f"run id: {run_id}    artifact folder: {paths.public}")
    return 0


def register(subparsers) -> None:
    parser = cli.command(
        subparsers, "dp-icl", _dp_icl, help="DP-ICL: answer queries by a noisy vote of private exemplar subsets "
                                            "(Wu et al.)",
        description="DP-ICL (Wu et al. 2024): each query is answered by report-noisy-max over the votes of M "
                    "prompts built from disjoint Poisson-subsampled private records (an extraction task: by the "
                    "query's words a noisy majority of the prompts answer). Says how many queries the budget "
                    "affords, charges the ledger, then answers.")
    add_private_flags(parser)
    parser.add_argument("--queries-file", default=None, metavar="FILE",
                        help="JSONL queries (a `text` per line, an optional `label`; other fields are kept); "
                             "default: the dataset's test items")
    cli.add_output_flags(parser, run_id=True, json_help="print one JSON object (keys: docs/methods/dp-icl.md)")


def _serve_private(args, listener: private_prediction.Listener) -> int:
    """`dpicl serve --private`: DP-ICL on the private records: the budget said, then every request charged before
    it is answered."""
    from tasks.dp_icl import open_run

    config, chosen, data = prepare(args)
    run_id = new_run_id()
    budget, answerer, paths = open_run(config, chosen, data, epsilon=args.epsilon,
                                       noise_multiplier=args.noise_multiplier, queries=args.queries, run_id=run_id,
                                       announce=lambda b: print(b.line(), file=sys.stderr, flush=True))
    code = listener.serve(
        create_private_app(answerer),
        f"serving DP-ICL private prediction on {data.spec.name} (ledger id {config.ledger_id}, run {run_id}) at "
        f"{listener.url}/v1/dp-icl: {budget.queries} queries can be answered, each batch charged before it is "
        "answered; Ctrl-C stops it")
    print(f"answered {answerer.answered} of {budget.queries} queries", file=sys.stderr)
    return code


def _predict_private(args) -> int:
    """`dpicl predict --private --endpoint URL`: the queries sent to a DP-ICL server (`dpicl serve --private`),
    which charges each batch before answering it; the noisy-argmax labels written as JSONL."""
    if args.endpoint is None:
        raise ConfigError("--private: name the DP-ICL server with --endpoint (e.g. http://127.0.0.1:8000/v1)")
    others = [f for f, v in (("--release", args.release != "production"), ("--dataset-id", args.dataset_id),
                             ("--model", args.model), ("--scoring", args.scoring), ("--retries", args.retries),
                             ("--max-new-tokens", args.max_new_tokens), ("--calibration", args.calibration is not None))
              if v]
    if others:
        raise ConfigError(f"{', '.join(others)}: do not apply to --private (the server decides)")
    batch = args.batch_size or MAX_BATCH
    if not 1 <= batch <= MAX_BATCH:
        raise ConfigError(f"--batch-size: must be 1 to {MAX_BATCH} with --private, got {batch}")
    out = cli.check_out_file("--out", args.out)
    queries = cli.read_queries(args.input)
    lines, remaining = [], None
    for start in range(0, len(queries), batch):  # each batch charged by the server before it is answered
        part = queries[start:start + batch]
        reply = request_answers(args.endpoint, [q["text"] for q in part], timeout=args.timeout or 600.0)
        remaining = reply.get("queries_remaining")
        for query, label in zip(part, reply["answers"], strict=True):
            row = {k: v for k, v in query.items() if k not in ("text", "line")}
            row["label"] = label
            lines.append(json.dumps(row) + "\n")
        if out is None:
            sys.stdout.writelines(lines[-len(part):])
            sys.stdout.flush()
    if out is not None:
        write_text_atomic(out, "".join(lines))
    print(f"answered {len(queries)} queries by DP-ICL (each batch charged to the ledger before it was answered); "
          f"{remaining} queries left on the server", file=sys.stderr)
    return 0


# `dpicl serve --private` and `dpicl predict --private` (filled when `flows.cli` imports this module)
private_prediction.register(private_prediction.PrivatePrediction(
    name="dp-icl",
    serve_help="serve DP-ICL private prediction on private records instead: each request's queries charged to the "
               "ledger before they are answered (docs/methods/dp-icl.md)",
    predict_help="ask a DP-ICL server (`dpicl serve --private`, at --endpoint) instead of a release: each batch of "
                 "queries is charged to its ledger before it is answered",
    serve=_serve_private, predict=_predict_private,
    add_serve_flags=lambda parser: add_private_flags(parser, config_fields=list(SERVE_FIELDS)),
    serve_only=SERVE_ONLY))
