"""The neighbouring-dataset test: the guard every command that writes public output passes.

DP's guarantee speaks of datasets that differ in one record. So each command runs three times with the
same seeds and settings: on D, on D plus one record, and on D with one record changed. Everything it
makes public (its --json, every file outside the private store, its MLflow params, metrics and tags,
its log lines and Prefect artifacts) must then be the same, apart from what is declared here:

- `DP_OUTPUTS`: the DP outputs and what is computed from them alone (the demonstrations, the trained
  prompt, the noisy labels and students, accuracies of those on the public test file, the loss curve on
  public examples, file digests of those);
- `VOLATILE`: run ids, timings, timestamps and the keyed data hash (a version id of the records: it says
  only whether two runs read the same records);
- `AUDIT_VERDICT`: the gate's verdict on a membership audit (passed, inconclusive or failed, with its
  figure-free reasons): the one bit of an audit that reaches the public side, by design (the figures
  stay in the private store);
- `COUNTS`, for the added record only: the record counts the papers treat as public and what the
  accountant derives from them (q, sigma, the label with the fewest records); markdown artifacts,
  rendered from those tables, are then compared with their numbers masked.

A function of individual private records that reaches the public side (a raw statistic, a private
validation loss, an audit AUC, an echo of a record) makes one of the comparisons fail. A new public
output either passes unchanged, or is declared here with the reason it is DP.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_support import home, prefect_harness, share_tiny_model  # noqa: F401

from dpcore.data.taskspec import TASKS_DIR

pytestmark = pytest.mark.usefixtures("prefect_harness")

# ------------------------------------------------------------------ the declaration: what may differ

# DP outputs, and functions of DP outputs and public data alone (keys of JSON objects, columns of tables,
# MLflow metric/param names).
DP_OUTPUTS = frozenset({
    # DP few-shot generation: the synthetic demonstrations
    "text", "demos", "demo", "synthetic_tokens", "tokens", "empty_demos",
    # PromptPATE: noisy labels (answered or not), the students built from them
    "noisy_label", "answered", "labelled", "answered_mean", "student_prompt", "student_prompts", "validation_accuracy",
    "best_repeat", "label", "per_repeat",
    # PromptDPSGD: the prompt tensor and its loss on public examples
    "val_loss", "curve", "weight",
    # accuracies on the public test file of the above
    "accuracy", "accuracy_mean", "accuracy_std", "calibrated_accuracy", "calibrated_accuracy_mean",
    "calibrated_accuracy_std", "mean", "std", "baselines",
    # digests of DP output files
    "sha256", "demos_sha256", "artifact_sha256", "files", "key", "demo_keys",
})
# Ids and clocks: different on every run whatever the data.
VOLATILE = frozenset({
    "run_id", "mlflow_run_id", "mlflow_run_ids", "mlflow_comparison_run_id", "mlflow_experiment_id", "flow_run_id",
    "prefect_flow_run_id", "dpicl_run_id", "created_at", "at", "timestamp", "wall_seconds", "seconds",
    "method_wall_seconds", "seconds_per_100_items", "data_hash", "content_hash", "fingerprint", "id", "ledger_entries", "entry_id",
    "out", "private_out", "run_dir", "private_run_dir", "manifest", "prompt", "prompts", "path", "prompt_path",
    "metrics_path", "release_dir", "tracking_uri", "home", "generation_workers", "dataset_id", "mlflow.runName",
    "mlflow.user", "mlflow.source.name", "mlflow.source.type", "mlflow.parentRunId", "mlflow.source.git.commit",
})
# The gate's verdict: the public face of an audit whose figures stay private.
AUDIT_VERDICT = frozenset({"verdict", "passed", "reasons", "audit", "audit_passed"})
# The record counts the papers treat as public (|D|, |D_y|: they set q) and what the accountant derives
# from them; they move when a record is added, never when one is changed.
COUNTS = frozenset({
    "num_private_records", "train_size", "records", "label_counts", "sampling_rate", "noise_multiplier", "sigma",
    "epsilon_upper", "epsilon", "epsilon_alone", "total_epsilon", "training_records", "q", "epochs", "planned_cost",
    "methods", "remaining", "entries", "ledger", "ledger_after", "privacy", "ledger_entry", "spends",
    "epsilon_per_repeat", "checkpoints", "steps", "epsilon_spent", "limiting_label", "per_label_epsilon", "planned_epsilon",
    "planned_epsilon_dp", "planned_epsilon_pate", "planned_epsilon_dpsgd", "planned_delta",
})
VERDICT_WORD = re.compile(r"\b(passed|failed|inconclusive)\b")
NUMBER = re.compile(r"\b\d+(\.\d+)?(e-?\d+)?\b")

DATA_ROWS_PER_LABEL = 20
LABELS = ("World", "Sports", "Business", "Technology")

# ------------------------------------------------------------------ the datasets


def _datasets(folder: Path) -> dict:
    """D, D plus one record and D with one record changed (user files), and the public files beside them."""
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    shipped = load_dataset(load_task_spec("agnews"))
    train = pd.concat([shipped.train[shipped.train["label"] == label].head(DATA_ROWS_PER_LABEL) for label in LABELS])
    train = train[["id", "text", "label"]].reset_index(drop=True)
    public = shipped.public.reset_index(drop=True)
    test = public.iloc[:12][["id", "text", "label"]]  # a public test file: accuracies on it are DP post-processing
    validation = public.iloc[12:24][["id", "text", "label"]]
    queries = public.iloc[24:60][["text"]]
    added = pd.concat([train, pd.DataFrame({"id": ["neighbour-added"], "label": ["World"],
                                            "text": ["A record only the neighbouring dataset holds: rare words "
                                                     "zygomorphic quetzal filibuster"]})], ignore_index=True)
    changed = train.copy()
    changed.loc[3, "text"] = "A changed record: its text differs in the neighbouring dataset, zygomorphic quetzal"
    files = {}
    for name, frame in (("D", train), ("added", added), ("changed", changed)):
        frame.to_csv(folder / f"{name}.csv", index=False)
        files[name] = str(folder / f"{name}.csv")
    test.to_csv(folder / "test.csv", index=False)
    validation.to_csv(folder / "validation.csv", index=False)
    queries.to_csv(folder / "queries.csv", index=False)
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="neighbours", source={"type": "file", "path": files["D"], "text_column": "text",
                                           "label_column": "label", "id_column": "id"},
                split={"test_size": 0.2, "seed": 0})
    (folder / "neighbours.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return {"data": files, "spec": str(folder / "neighbours.yaml"), "test": str(folder / "test.csv"),
            "validation": str(folder / "validation.csv"), "queries": str(folder / "queries.csv")}


def _data_flags(files: dict, variant: str) -> list[str]:
    return ["--task-spec", files["spec"], "--dataset", "neighbours", "--data-path", files["data"][variant],
            "--test-path", files["test"], "--model", "tiny-random", "--delta", "1e-3", "--seed", "5"]


COMMANDS = ("run", "generate", "pate", "pate-dd", "tune", "tune-lora", "evaluate", "audit", "release")
# PromptPATE's data-dependent accounting charges the labelling at its released cost, a DP output: every epsilon
# the command shows after the labelling (its --json, the ledger's entries and total, its log lines) is one.
COMMAND_DP_OUTPUTS = {"pate-dd": frozenset({"epsilon", "released_rdp", "epsilon_upper", "total_epsilon", "event",
                                            "remaining"})}
GENERATION = ["--num-subsets", "2", "--subset-size", "1", "--top-k", "10", "--max-tokens", "3"]
PATE = ["--pate-teachers", "8", "--pate-queries", "10", "--pate-sigma1", "50", "--pate-sigma2", "50",
        "--pate-threshold", "0", "--pate-repeats", "1", "--pate-student-candidates", "2"]
DPSGD = ["--dpsgd-length", "2", "--dpsgd-steps", "2", "--dpsgd-batch-size", "8", "--dpsgd-validation-size", "6"]


def _commands(files: dict, variant: str, run_ids: dict) -> dict[str, list[str]]:
    """Every command that writes public output, with its arguments for one variant."""
    data = _data_flags(files, variant)
    ds = ["--dataset-id", f"nb-{variant}"]
    demos = run_ids.get("demos_of_D", "")  # every variant evaluates D's generated (public, DP) demos
    return {
        "run": ["run", *data, *ds, "--methods", "tang,pate,dpsgd", "--epsilons", "1", "--run-id", f"nb-run-{variant}",
                "--baselines", "zero-shot", "--seeds", "1", "--shots", "2", *GENERATION, *PATE,
                "--pate-public-path", files["queries"], *DPSGD, "--dpsgd-validation-path", files["validation"],
                "--audit", "--audit-mode", "run-demos", "--audit-trials", "2", "--audit-demo-sets", "1",
                "--audit-members", "4", "--audit-reference-prompts", "0", "--no-audit-reference", "--yes", "--json"],
        "generate": ["generate", *data, *ds, "--epsilon", "1", *GENERATION, "--shots", "1",
                     "--out", str(Path(files["spec"]).parent / f"generate-{variant}"), "--json"],
        "pate": ["pate", *data, *ds, "--epsilon", "1", "--teachers", "8", "--queries", "10", "--sigma1", "50", "--sigma2", "50",
                 "--threshold", "0", "--repeats", "1", "--student-candidates", "2", "--public-path",
                 files["queries"], "--test-size", "6", "--run-id", f"nb-pate-{variant}", "--json"],
        "pate-dd": ["pate", *data, *ds, "--epsilon", "1000", "--teachers", "8", "--queries", "10", "--sigma1", "50",
                    "--sigma2", "50", "--threshold", "0", "--repeats", "1", "--student-candidates", "2",
                    "--public-path", files["queries"], "--test-size", "6", "--accounting", "data-dependent",
                    "--run-id", f"nb-pate-dd-{variant}", "--json"],
        "tune": ["tune", *data, *ds, "--epsilon", "1", "--length", "2", "--steps", "2", "--batch-size", "8",
                 "--validation-size", "6", "--validation-path", files["validation"], "--test-size", "6",
                 "--run-id", f"nb-tune-{variant}", "--json"],
        # the DP LoRA baseline: its adapter file, manifest and accuracy are DP outputs like a trained prompt
        "tune-lora": ["tune", *data, *ds, "--epsilon", "1", "--kind", "lora", "--rank", "2", "--steps", "2",
                      "--batch-size", "8", "--validation-size", "6", "--validation-path", files["validation"],
                      "--test-size", "6", "--run-id", f"nb-tune-lora-{variant}", "--json"],
        "evaluate": ["evaluate", *data, "--demos", demos, "--seeds", "1", "--shots", "2",
                     "--out", str(Path(files["spec"]).parent / f"evaluate-{variant}"), "--json"],
        "audit": ["audit", *data, *ds, "--epsilon", "1", *GENERATION, "--trials", "2", "--audit-members", "4",
                  "--audit-demo-sets", "1", "--audit-reference-prompts", "0",
                  "--out", str(Path(files["spec"]).parent / f"audit-{variant}"), "--json"],
        "release": ["release", "--run", f"nb-run-{variant}", "--method", "dpsgd", "--audit-only", "--trials", "2",
                    "--audit-members", "4", "--audit-reference-prompts", "0", "--json"],
    }


# ------------------------------------------------------------------ what a command made public

HEX = re.compile(r"\b[0-9a-f]{12,64}\b")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(\+\d{2}:\d{2}|Z)?")
SECONDS = re.compile(r"\b\d+(\.\d+)? ?s\b|\b\d+(\.\d+)?s/it|\d+:\d{2}(:\d{2})?")
# Not compared as files: the private store; library state (models, Prefect and MLflow databases: their
# contents are compared through MLflow's API and the Prefect artifacts); the stage cache (copies of the
# outputs compared here, keyed by content, and the accountant's cache of public parameters).
PUBLIC_SKIP = ("private", "models", "hf", "config", "prefect", "mlflow", "logs", "cache")
LOG_LINE = re.compile(r"\| (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\||^\d{4}/\d{2}/\d{2} .*\b(DEBUG|INFO|WARNING)\b")


def _text(value: str, variant: str) -> str:
    for kind in ("run", "pate-dd", "pate", "tune-lora", "tune"):
        value = value.replace(f"nb-{kind}-{variant}", f"<{kind.upper()}>")
    value = value.replace(f"nb-{variant}", "<DS>")
    value = value.replace(f"generate-{variant}", "<OUT>").replace(f"evaluate-{variant}", "<OUT>")
    value = value.replace(f"audit-{variant}", "<OUT>").replace(f"{variant}.csv", "<DATA>.csv")
    value = UUID.sub("<UUID>", TIME.sub("<TIME>", value))
    return HEX.sub("<HEX>", value)


def _normal(value, variant: str, masked: frozenset):
    """The JSON-like `value` with masked keys replaced and variant names, hashes and clocks normalised."""
    if isinstance(value, dict):
        return {_text(str(k), variant): ("<masked>" if str(k) in masked else _normal(v, variant, masked))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v, variant, masked) for v in value]
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in "[{":
            try:
                return _normal(json.loads(stripped), variant, masked)
            except json.JSONDecodeError:
                pass
        return _text(value, variant)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _snapshot() -> dict[str, float]:
    root = home()
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def _public_files(before: dict[str, float]) -> dict[str, object]:
    """Every file written outside the private store since the `before` snapshot, decoded (Parquet as
    records, JSON as objects, images by name only)."""
    root = home()
    found = {}
    for rel, mtime in _snapshot().items():
        path = root / rel
        if before.get(rel) == mtime or Path(rel).parts[0] in PUBLIC_SKIP:
            continue
        if path.suffix in (".db", ".db-wal", ".db-shm", ".db-journal", ".lock", ".pt"):
            continue
        if path.suffix == ".parquet":
            found[rel] = pd.read_parquet(path).to_dict(orient="records")
        elif path.suffix == ".json":
            found[rel] = json.loads(path.read_text())
        elif path.suffix in (".png", ".safetensors"):
            found[rel] = "<binary DP output or plot of one>"
        else:
            found[rel] = path.read_text(errors="replace")
    return found


def _markdown(text: str) -> str:
    """A markdown table's `wall s` column is a timing: blanked (whole seconds, different on every run)."""
    lines, wall = [], None
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and "wall s" in cells[-2:][0]:
            wall = len(cells) - 2
        elif wall is not None and line.startswith("|") and len(cells) == wall + 2:
            cells[wall] = " <T> "
            cells = [VERDICT_WORD.sub("<VERDICT>", cell) for cell in cells]  # AUDIT_VERDICT in a table
        elif not line.startswith("|"):
            wall = None
        lines.append("|".join(cells))
    return "\n".join(lines)


def _mlflow(run_id_tag: str | None) -> list[dict]:
    if run_id_tag is None:
        return []
    from tasks.tracking import mlflow_client

    client = mlflow_client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.dpicl_run_id = '{run_id_tag}'")
    return sorted(({"name": r.info.run_name, "params": r.data.params, "metrics": r.data.metrics,
                    "tags": r.data.tags} for r in runs), key=lambda r: str(r["name"]))


def _prefect_artifacts(tag: str) -> list[dict]:
    """The artifacts of the flow runs tagged `tag` (one command's, a tag no earlier run had): the test server
    is shared with the other test processes, whose runs write artifacts meanwhile."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])))
    return sorted(({"key": a.key, "type": a.type, "data": _markdown(a.data) if isinstance(a.data, str) else a.data,
                    "description": a.description}
                   for a in artifacts), key=lambda a: str(a["key"]))


RUN_NAME = re.compile(r"((?:sub)?flow run|[Tt]ask run) '[^']+'")
LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "dpicl", "tasks", "flows", "dpcore")


# DP outputs and the audit's verdict inside log lines (the same declarations as DP_OUTPUTS, AUDIT_VERDICT)
LOGGED_DP = re.compile(r"((?:answered|accuracy|validation loss)(?: per repeat)?)\s*(\[[^\]]*\]|[-\d.]+)")


def _logs(records) -> list[str]:
    """The log lines, with Prefect's random run names and its cache-hit wording (a stage whose inputs
    are public counts is served from the cache when the counts are unchanged) normalised, and the DP
    outputs and verdicts they quote masked."""
    lines = set()
    for r in records:
        text = RUN_NAME.sub(r"\1 <NAME>", SECONDS.sub("<T>", r.getMessage()))
        text = VERDICT_WORD.sub("<VERDICT>", LOGGED_DP.sub(r"\1 <DP>", text))
        lines.add(text.replace("Cached(type=COMPLETED)", "Completed()"))
    return sorted(lines)


@pytest.fixture(scope="module")
def neighbour_runs(tiny_lm, tmp_path_factory):
    """Every command on every variant: {command: {variant: what it made public}}."""
    import logging

    from flows.cli import main

    share_tiny_model(tiny_lm)
    files = _datasets(tmp_path_factory.mktemp("neighbours"))
    outputs: dict[str, dict[str, dict]] = {}
    run_ids: dict = {}
    from prefect import tags
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    handler = _Collect()
    for name in LOGGERS:  # the run's own loggers, whatever propagation other tests set up
        logging.getLogger(name).addHandler(handler)
    # every stage computes in every variant: a stage served from a cache an earlier test (or variant) filled
    # logs nothing of its own, a difference of caching, not of the data
    refresh = temporary_settings(updates={PREFECT_TASKS_REFRESH_CACHE: True})
    refresh.__enter__()
    try:
        for variant in ("D", "added", "changed"):
            for command in COMMANDS:  # built one at a time: evaluate reads the demos generate wrote for D
                argv = _commands(files, variant, run_ids)[command]
                before = _snapshot()
                handler.records.clear()
                tag = f"neighbours-{uuid.uuid4().hex}"
                with tags(tag):  # the command's flow runs, among those of the other test process
                    code, out, err = _run(main, argv)
                assert code in (0, 1), f"{command} on {variant}: exit {code}: {err[-2000:]}"
                summary = json.loads(out) if out.strip().startswith("{") else {"stdout": out}
                if command == "generate" and variant == "D":
                    run_ids["demos_of_D"] = str(Path(summary["out"]) / "demos.parquet")
                run_tag = {"run": f"nb-run-{variant}", "pate": f"nb-pate-{variant}", "pate-dd": f"nb-pate-dd-{variant}",
                           "tune": f"nb-tune-{variant}", "tune-lora": f"nb-tune-lora-{variant}"}.get(command)
                outputs.setdefault(command, {})[variant] = {
                    "exit": code, "json": summary, "files": _public_files(before), "mlflow": _mlflow(run_tag),
                    "artifacts": _prefect_artifacts(tag), "logs": _logs(handler.records),
                    # the command's own lines (log lines are compared through the log records)
                    "stderr": [SECONDS.sub("<T>", line) for line in err.splitlines()
                               if "\r" not in line and not LOG_LINE.search(line)]}
    finally:
        refresh.__exit__(None, None, None)
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(handler)
    assert {a["key"] for a in outputs["run"]["D"]["artifacts"]} >= {"dp-fewshot-summary", "dp-fewshot-results", "prompt-pate-results"}
    return outputs


class _Collect(__import__("logging").Handler):
    def __init__(self):
        super().__init__(level=20)
        self.records = []

    def emit(self, record):
        if record not in self.records:  # a record may reach two of the loggers it is attached to
            self.records.append(record)


def _run(main, argv):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _compare(outputs: dict, variant: str, masked: frozenset) -> list[str]:
    """The public outputs of `variant` that differ from D's, once normalised: [] when none."""
    base, other = outputs["D"], outputs[variant]
    problems = []
    counts_move = bool(masked & COUNTS)
    for part in ("exit", "json", "mlflow", "artifacts", "logs", "stderr"):
        a, b = _normal(base[part], "D", masked), _normal(other[part], variant, masked)
        if counts_move and part in ("artifacts", "logs", "stderr"):  # counts inside rendered text
            a, b = _numbers_masked(a), _numbers_masked(b)
        if a != b:
            problems.append(f"{part}: {_first_difference(a, b)}")
    a_files = {_text(k, "D"): _normal(v, "D", masked) for k, v in base["files"].items()}
    b_files = {_text(k, variant): _normal(v, variant, masked) for k, v in other["files"].items()}
    if set(a_files) != set(b_files):
        problems.append(f"files: only in D {sorted(set(a_files) - set(b_files))}, only in {variant} "
                        f"{sorted(set(b_files) - set(a_files))}")
    for name in sorted(set(a_files) & set(b_files)):
        if a_files[name] != b_files[name]:
            problems.append(f"file {name}: {_first_difference(a_files[name], b_files[name])}")
    return problems


def _numbers_masked(value):
    if isinstance(value, dict):
        return {k: _numbers_masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_masked(v) for v in value]
    if isinstance(value, str):
        return NUMBER.sub("<N>", value)
    return "<N>" if isinstance(value, int | float) and not isinstance(value, bool) else value


def _first_difference(a, b, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key, "<absent>") != b.get(key, "<absent>"):
                return _first_difference(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{where}.{key}")
    if isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b) and a != b:
        return f"{where or 'lines'}: only in D {sorted(set(a) - set(b))[:5]}, only in the neighbour {sorted(set(b) - set(a))[:5]}"
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return f"{where or 'value'}: {str(a)[:300]!r} != {str(b)[:300]!r}"


@pytest.mark.parametrize("command", COMMANDS)
def test_changing_one_record_changes_no_public_output_but_dp_outputs(neighbour_runs, command):
    masked = DP_OUTPUTS | VOLATILE | AUDIT_VERDICT | COMMAND_DP_OUTPUTS.get(command, frozenset())
    problems = _compare(neighbour_runs[command], "changed", masked)
    assert not problems, f"dpicl {command}: a public output depends on a changed record:\n" + "\n".join(problems)


@pytest.mark.parametrize("command", COMMANDS)
def test_adding_one_record_changes_no_public_output_but_dp_outputs_and_counts(neighbour_runs, command):
    masked = DP_OUTPUTS | VOLATILE | AUDIT_VERDICT | COUNTS | COMMAND_DP_OUTPUTS.get(command, frozenset())
    problems = _compare(neighbour_runs[command], "added", masked)
    assert not problems, f"dpicl {command}: a public output depends on an added record:\n" + "\n".join(problems)


def test_the_scan_catches_a_planted_statistic(neighbour_runs):
    """The comparison is not vacuous: a private statistic (a loss over the private records, which the
    neighbours move) planted in the run's --json is caught."""
    planted = json.loads(json.dumps(neighbour_runs["run"]))
    planted["D"]["json"]["private_loss"] = 1.2345
    planted["changed"]["json"]["private_loss"] = 1.2351
    assert any("private_loss" in p for p in _compare(planted, "changed", DP_OUTPUTS | VOLATILE | AUDIT_VERDICT))


def test_the_splits_put_the_neighbour_into_exactly_ds_splits_plus_the_record(tmp_path):
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    files = _datasets(tmp_path)
    spec = load_task_spec(files["spec"])
    d = load_dataset(spec, files["data"]["D"])  # no test file: the split is carved out of the records
    added = load_dataset(spec, files["data"]["added"])
    assert set(added.train["id"]) | set(added.test["id"]) == set(d.train["id"]) | set(d.test["id"]) | {"neighbour-added"}
    assert set(d.train["id"]) <= set(added.train["id"]) and set(d.test["id"]) <= set(added.test["id"])
    changed = load_dataset(spec, files["data"]["changed"])
    assert (set(changed.train["id"]), set(changed.test["id"])) == (set(d.train["id"]), set(d.test["id"]))
