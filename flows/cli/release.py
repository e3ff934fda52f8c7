"""CLI: `dpicl release` (the audited release gate), `dpicl predict` (ICL with released demos only, on a local
model or through an OpenAI-compatible endpoint) and `dpicl export` (a release as a plain prompt template)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dpcore.audit.config import AuditConfig
from dpcore.data.artifacts import jsonable, write_bytes_atomic, write_json_atomic, write_text_atomic
from dpcore.display import fmt_delta, fmt_eps
from dpcore.errors import ConfigError
from dpcore.home import dpicl_home, find_run_dir
from dpcore.names import METHODS, PREDICTION_METHODS, method_name
from flows.cli import private_prediction
from flows.cli.common import check_out_file, command, print_json, read_queries
from flows.cli.endpoint import add_endpoint_flags, endpoint_config


def _audit_config(args):
    updates = {k: v for k, v in (("trials", args.trials), ("members", args.audit_members),
                                 ("non_members", args.audit_members), ("reference_prompts", args.audit_reference_prompts),
                                 ("max_record_tokens", args.audit_max_record_tokens),
                                 ("auc_tolerance", args.auc_tolerance), ("test", args.audit_test),
                                 ("leak_auc", args.leak_auc), ("power", args.audit_power)) if v is not None}
    try:
        return AuditConfig(**updates)
    except ValueError as exc:
        raise ConfigError(f"audit flags: {exc}") from None


def _release(args) -> int:
    if args.method == "tang" and (args.teacher_reference or args.audit_only or args.repeat is not None
                                  or args.seed is not None):
        raise ConfigError("--teacher-reference, --audit-only, --repeat and --seed apply to --method pate or dpsgd")
    if args.teacher_reference and args.method != "pate":
        raise ConfigError("--teacher-reference: the single-teacher contrast is PromptPATE's (--method pate)")
    options = {} if args.method == "tang" else dict(
        audit_config=_audit_config(args), teacher_reference=args.teacher_reference, audit_only=args.audit_only,
        training=args.training, repeat=args.repeat, device=args.device, seed=args.seed,
        size_to_pools=args.trials is None and args.audit_members is None)
    find_run_dir(args.run, dpicl_home())  # a run id with no folder is refused before Prefect and its server start
    # torch, Prefect load here, not for `dpicl --help`
    from flows.release import release

    if args.teacher_reference:
        print("WARNING: the single-teacher contrast puts real private records in prompts: it is charged to the "
              "run's ledger id as an infinite spend (epsilon = inf) before any record is read.", file=sys.stderr)
    result = release(run_id=args.run, epsilon=args.epsilon, alias=args.alias, method=args.method, **options)
    if args.json:
        print_json(result)
    elif args.audit_only:
        for name, audit in (("artifact " + result["artifact"], result["audit"]),
                            ("single teachers (non-private)", result.get("teacher_reference"))):
            if audit:
                print(f"audit of {name}: {audit['verdict']}"
                      + "".join(f"\n  - {reason}" for reason in audit.get("reasons", [])))
    else:
        what = "" if args.method == "tang" else f"{args.method} {result['artifact']} "
        print(f"released run {result['run_id']} {what}at epsilon {fmt_eps(result['epsilon'])} as {result['registered_model']} "
              f"version {result['version']} (alias {result['alias']})")
        print(f"release folder: {result['release_dir']}")
    return 0


def _predict(args) -> int:
    private = private_prediction.registered()
    if private is not None and args.private:
        return private.predict(args)
    # torch, Prefect load here, not for `dpicl --help`
    from tasks.release import answer_queries

    endpoint = endpoint_config(args, args.model)
    out = check_out_file("--out", args.out)  # before any work
    queries = read_queries(args.input)
    manifest, model_name, answers = answer_queries(args.release, args.dataset_id, [q["text"] for q in queries],
                                                   model=args.model, device=args.device,
                                                   calibrate=args.calibration, endpoint=endpoint)
    lines = []
    for query, answer in zip(queries, answers, strict=True):
        row = {k: v for k, v in query.items() if k not in ("text", "line")}
        row.update(answer)
        lines.append(json.dumps(row) + "\n")
    if out is None:
        sys.stdout.writelines(lines)
    else:
        write_text_atomic(out, "".join(lines))
    eps = manifest.get("epsilon")
    where = f"on model {model_name}"
    if endpoint is not None:
        modes = sorted({a.get("scoring", "") for a in answers})
        from dpcore.release.endpoint import base_url, shown_url

        where = (f"through endpoint {shown_url(base_url(endpoint.url))} model {model_name}"
                 + (f" (scoring: {', '.join(modes)})" if modes else ""))
    calibrated = answers[0].get("calibrated") if answers else None
    scored = "" if calibrated is None else ", calibrated" if calibrated else ", raw scores"
    print(f"answered {len(queries)} queries with release v{manifest['release_version']} of {manifest['dataset_id']} "
          f"(epsilon {fmt_eps(eps)}, delta {fmt_delta(manifest.get('delta'))}; "
          f"post-processing: no further privacy cost) {where}{scored}", file=sys.stderr)
    return 0


def _export(args) -> int:
    # torch, Prefect load here, not for `dpicl --help`
    from dpcore.release.export import guarantee_line
    from tasks.release import export_release

    out = check_out_file("--out", args.out)  # before the release is read
    if out is not None and args.format == "text":
        check_out_file("--out", f"{args.out}.release.json")  # the guarantee's copy beside the template
    manifest, exported = export_release(args.release, args.dataset_id, args.placeholder)
    if args.format == "json":
        if args.out:
            write_json_atomic(Path(args.out), jsonable(exported))
            print(f"wrote {args.out}", file=sys.stderr)
        else:
            print_json(exported)
    elif args.out:
        out = Path(args.out)
        write_text_atomic(out, exported["template"])
        guarantee_file = out.with_name(out.name + ".release.json")
        write_bytes_atomic(guarantee_file, (Path(manifest["release_dir"]) / "release.json").read_bytes())
        print(f"wrote {out} (placeholder {exported['placeholder']}) and {guarantee_file}", file=sys.stderr)
    else:
        sys.stdout.write(exported["template"])  # exactly the template: no newline added after the answer prefix
        sys.stdout.flush()
    print(guarantee_line(manifest), file=sys.stderr)
    return 0


def register(subparsers) -> None:

    release = command(subparsers, "release", _release, help="gate a finished run and release its DP demos as production")
    release.add_argument("--run", required=True, help="the run id printed by `dpicl run`")
    # a prediction method (PREDICTION_METHODS) releases no prompt: its answers are served (`dpicl serve --private`)
    release.add_argument("--method", type=method_name, choices=[m for m in METHODS if m not in PREDICTION_METHODS],
                         default="tang",
                         help="what to release: tang (DP few-shot demos, default), pate (the PromptPATE student "
                              "prompt), dpsgd (a PromptDPSGD trained prompt), adadpsyn (AdaDPSyn's demos) or dp-opt "
                              "(DP-OPT's instruction); all but tang's are audited first")
    release.add_argument("--epsilon", type=float, default=None,
                         help="which DP epsilon of the run (tang, dpsgd; default: smallest)")
    release.add_argument("--training", type=int, default=0, help="dpsgd: which training of that epsilon (default 0)")
    release.add_argument("--repeat", type=int, default=None,
                         help="pate: which repeat's student prompt (default: the run's best on public validation)")
    release.add_argument("--teacher-reference", action="store_true",
                         help="pate: also audit single teachers' prompts (real records: non-private, charged as an "
                              "infinite spend)")
    release.add_argument("--audit-only", action="store_true", help="pate, dpsgd: run the audit and stop")
    release.add_argument("--trials", type=int, default=None,
                         help="pate, dpsgd: audit trials (default: with --audit-members unset, the cheapest design "
                              "that concludes on the run's pools; else 20)")
    release.add_argument("--audit-members", type=int, default=None,
                         help="pate, dpsgd: members (and as many non-members) per trial (default: sized with "
                              "--trials; else 50)")
    release.add_argument("--audit-reference-prompts", type=int, default=None,
                         help="pate, dpsgd: R >= 2 adds the LiRA attacks against R OUT prompts, R more forward "
                              "passes per record (default 0: the three calibrated attacks)")
    release.add_argument("--audit-max-record-tokens", type=int, default=None,
                         help="pate, dpsgd: score each record's first N tokens only")
    release.add_argument("--audit-test", choices=["detect", "equivalence"], default=None,
                         help="pate, dpsgd: the audit gate's test: detect (default) fails when an attack distinguishes "
                              "members, sized to detect --leak-auc with --audit-power; equivalence passes only when "
                              "every AUC interval lies inside 0.5 +/- --auc-tolerance")
    release.add_argument("--leak-auc", type=float, default=None,
                         help="pate, dpsgd (detect): the leak, a mean per-trial AUC, the audit is sized to detect "
                              "(default 0.75)")
    release.add_argument("--audit-power", type=float, default=None,
                         help="pate, dpsgd (detect): the probability of detecting it (default 0.95)")
    release.add_argument("--auc-tolerance", type=float, default=None,
                         help="pate, dpsgd (equivalence): the gate's band, |AUC - 0.5| within this (default 0.05)")
    release.add_argument("--seed", type=int, default=None,
                         help="pate, dpsgd: the audit's seed (member draws and trials; not privacy noise); default: "
                              "derived from the data's content hash")
    release.add_argument("--device", default="auto", help="pate, dpsgd: the audit's device (default: auto)")
    release.add_argument("--alias", default="production", help="registry alias to move (default: production)")
    release.add_argument("--json", action="store_true", help="print one JSON object")

    predict = command(subparsers, "predict", _predict, help="answer ICL queries with released demos only (no privacy cost)")
    predict.add_argument("--release", default="production", help="an alias or a version number")
    predict.add_argument("--input", required=True, help="JSONL with a `text` field per line (other fields are kept)")
    predict.add_argument("--dataset-id", default=None, help="which dataset's release, when several exist")
    predict.add_argument("--model", default=None,
                         help="any model (default: the model that generated the demos); with --endpoint, the "
                              "served model's name (default: the server's only model)")
    predict.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    scoring = predict.add_mutually_exclusive_group()
    scoring.add_argument("--no-calibration", dest="calibration", action="store_false", default=None,
                         help="raw predictions (no contextual calibration)")
    scoring.add_argument("--calibration", dest="calibration", action="store_true",
                         help="contextually calibrated predictions (default: calibrated for demonstrations, raw for "
                              "a PromptDPSGD prompt, the scoring each method's accuracy is reported with)")
    predict.add_argument("--out", default=None, help="write JSONL here (default: stdout)")
    private = private_prediction.registered()
    if private is not None:
        predict.add_argument("--private", action="store_true", help=private.predict_help)
        private.add_predict_flags(predict)
    add_endpoint_flags(predict)

    export = command(
        subparsers, "export", _export, help="a release as a plain prompt template for any model (no privacy cost)",
        description="The released demonstrations (method tang) or PromptPATE's student prompt (method pate) as the "
                    "prompt dpicl builds, with a placeholder for the query, the labels and the release's guarantee. "
                    "A PromptDPSGD trained prompt has no text form and is refused.")
    export.add_argument("--release", default="production", help="an alias or a version number")
    export.add_argument("--dataset-id", default=None, help="which dataset's release, when several exist")
    export.add_argument("--format", choices=("json", "text"), default="json",
                        help="json (default): one object (guarantee, template, labels, demos); text: the template "
                             "alone (the guarantee on stderr, or in OUT.release.json with --out)")
    export.add_argument("--placeholder", default=None, help="where the query goes in the template (default {text})")
    export.add_argument("--out", default=None, help="write here instead of stdout")
