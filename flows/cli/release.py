"""CLI: `dpicl release` (the audited release gate) and `dpicl predict` (ICL with released demos only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dpcore.display import fmt_delta, fmt_eps
from flows.cli.common import print_json


def _audit_config(args):
    from dpcore.config import AuditConfig
    from dpcore.errors import ConfigError

    updates = {k: v for k, v in (("trials", args.trials), ("members", args.audit_members),
                                 ("non_members", args.audit_members), ("reference_prompts", args.audit_reference_prompts),
                                 ("max_record_tokens", args.audit_max_record_tokens)) if v is not None}
    try:
        return AuditConfig(**updates)
    except ValueError as exc:
        raise ConfigError(f"audit flags: {exc}") from None


def _release(args) -> int:
    from dpcore.errors import ConfigError
    from flows.release import release

    if args.method == "tang" and (args.teacher_reference or args.audit_only or args.repeat is not None):
        raise ConfigError("--teacher-reference, --audit-only and --repeat apply to --method pate or dpsgd")
    if args.teacher_reference and args.method != "pate":
        raise ConfigError("--teacher-reference: the single-teacher contrast is PromptPATE's (--method pate)")
    options = {} if args.method == "tang" else dict(
        audit_config=_audit_config(args), teacher_reference=args.teacher_reference, audit_only=args.audit_only,
        training=args.training, repeat=args.repeat, device=args.device)
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


def _read_queries(path: Path) -> list[dict]:
    from dpcore.datasets import read_jsonl
    from dpcore.errors import DataValidationError

    rows = []
    for obj in read_jsonl(path):
        line_no = obj.pop("__line__")
        if not isinstance(obj.get("text"), str) or not obj["text"].strip():
            raise DataValidationError(f"{path}: line {line_no}: column 'text': expected a non-empty string")
        rows.append({"line": line_no, **obj})
    return rows


def _predict(args) -> int:
    from dpcore.errors import DataValidationError
    from tasks.release import answer_queries

    path = Path(args.input)
    if not path.exists():
        raise DataValidationError(f"{path}: file not found")
    queries = _read_queries(path)
    manifest, model_name, answers = answer_queries(args.release, args.dataset_id, [q["text"] for q in queries],
                                                   model=args.model, device=args.device,
                                                   calibrate=not args.no_calibration)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        for query, answer in zip(queries, answers, strict=True):
            row = {k: v for k, v in query.items() if k not in ("text", "line")}
            row.update(answer)
            out.write(json.dumps(row) + "\n")
    finally:
        if args.out:
            out.close()
    eps = manifest.get("epsilon")
    print(f"answered {len(queries)} queries with release v{manifest['release_version']} of {manifest['dataset_id']} "
          f"(epsilon {fmt_eps(eps)}, delta {fmt_delta(manifest.get('delta'))}; "
          f"post-processing: no further privacy cost) on model {model_name}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    release = subparsers.add_parser("release", help="gate a finished run and release its DP demos as production")
    release.add_argument("--run", required=True, help="the run id printed by `dpicl run`")
    release.add_argument("--method", choices=("tang", "pate", "dpsgd"), default="tang",
                         help="what to release: tang (DP few-shot demos, default), pate (the PromptPATE student "
                              "prompt) or dpsgd (a PromptDPSGD trained prompt); pate and dpsgd are audited first")
    release.add_argument("--epsilon", type=float, default=None,
                         help="which DP epsilon of the run (tang, dpsgd; default: smallest)")
    release.add_argument("--training", type=int, default=0, help="dpsgd: which training of that epsilon (default 0)")
    release.add_argument("--repeat", type=int, default=None,
                         help="pate: which repeat's student prompt (default: the run's best on public validation)")
    release.add_argument("--teacher-reference", action="store_true",
                         help="pate: also audit single teachers' prompts (real records: non-private, charged as an "
                              "infinite spend)")
    release.add_argument("--audit-only", action="store_true", help="pate, dpsgd: run the audit and stop")
    release.add_argument("--trials", type=int, default=None, help="pate, dpsgd: audit trials (default 20)")
    release.add_argument("--audit-members", type=int, default=None,
                         help="pate, dpsgd: members (and as many non-members) per trial (default 50)")
    release.add_argument("--audit-reference-prompts", type=int, default=None,
                         help="pate, dpsgd: LiRA OUT prompts (default 4; below 2: no LiRA)")
    release.add_argument("--audit-max-record-tokens", type=int, default=None,
                         help="pate, dpsgd: score each record's first N tokens only")
    release.add_argument("--device", default="auto", help="pate, dpsgd: the audit's device (default: auto)")
    release.add_argument("--alias", default="production", help="registry alias to move (default: production)")
    release.add_argument("--json", action="store_true", help="print one JSON object")
    release.set_defaults(handler=_release)

    predict = subparsers.add_parser("predict", help="answer ICL queries with released demos only (no privacy cost)")
    predict.add_argument("--release", default="production", help="an alias or a version number")
    predict.add_argument("--input", required=True, help="JSONL with a `text` field per line (other fields are kept)")
    predict.add_argument("--dataset-id", default=None, help="which dataset's release, when several exist")
    predict.add_argument("--model", default=None, help="any model (default: the model that generated the demos)")
    predict.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    predict.add_argument("--no-calibration", action="store_true", help="raw predictions (no contextual calibration)")
    predict.add_argument("--out", default=None, help="write JSONL here (default: stdout)")
    predict.set_defaults(handler=_predict)
