"""CLI: `dpicl release` (the audited release gate) and `dpicl predict` (ICL with released demos only)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from flows.cli.common import print_json


def _release(args) -> int:
    from flows.release import release

    result = release(run_id=args.run, epsilon=args.epsilon, alias=args.alias)
    if args.json:
        print_json(result)
    else:
        print(f"released run {result['run_id']} at epsilon {result['epsilon']:g} as {result['registered_model']} "
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
    from dpcore import predict
    from dpcore.errors import DataValidationError
    from dpcore.taskspec import TaskSpec
    from tasks.common import language_model
    from tasks.release import load_release

    path = Path(args.input)
    if not path.exists():
        raise DataValidationError(f"{path}: file not found")
    queries = _read_queries(path)
    manifest = load_release(args.release, args.dataset_id)
    spec = TaskSpec.model_validate(manifest["task_spec"])
    lm = language_model(args.model or manifest["model"], device=args.device)
    demos = [(d["text"], d["label"]) for d in manifest["demos"]]
    answers = predict.answer(lm, spec, demos, [q["text"] for q in queries], calibrate=not args.no_calibration)
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
          f"(epsilon {eps if eps is None or not math.isinf(float(eps)) else 'inf'}, delta {manifest.get('delta')}; "
          f"post-processing: no further privacy cost) on model {lm.name}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    release = subparsers.add_parser("release", help="gate a finished run and release its DP demos as production")
    release.add_argument("--run", required=True, help="the run id printed by `dpicl run`")
    release.add_argument("--epsilon", type=float, default=None, help="which DP epsilon of the run (default: smallest)")
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
