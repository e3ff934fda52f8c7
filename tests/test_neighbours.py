"""The neighbouring-dataset test: the guard every command that writes public output passes.

DP's guarantee speaks of datasets that differ in one record. So each command runs with the same seeds and
settings on D and on D plus one record, and, where it checks what the added record cannot (`CHANGED_TOO`),
on D with one record changed. Everything it makes public must then be the same, byte for byte once run ids,
uuids and clock times are normalised, apart from the fields its writer declares (`dpcore.public_outputs`:
by output and path, each with its kind). What is read:

- its `--json` and every line it prints on the terminal, and every log line of the run's loggers;
- every file under `$DPICL_HOME` outside `private/` that it wrote or changed: the run folders, the stage
  cache (`cache/`, the tasks' persisted results), `logs/`, MLflow's folder and every SQLite database there
  (the rows the command added: MLflow's store, the ledger), `*.pt`, `*.safetensors` and plots (by content);
- MLflow's params, metrics and tags of its runs and the Prefect artifacts of its flow runs.

Declared fields are masked only in the output and at the path declared (a DP value quoted anywhere else
fails the test), and `COUNT` fields only for the added record. Not read: the shared model files, the
accountant's cache (`cache/accounting/`: public parameters and their answers, shared with the other test
processes) and the Prefect server's own database (outside the home in this test: its task runs' start
and end times are the orchestrator's, see docs/privacy.md).

The variants fold the neighbour pairs into few commands: a user file with an id column and a public test
file (`run`, `pate-dd`, `tune-full`), a file without an id column (rows named by their content: `generate`,
`audit`, `tune-lora`), a test split carved out of the user's own file (`pate`, `tune` with a prefix,
`evaluate`: the accuracy published there is over test rows, which no mechanism reads; the guarantee covers
the training rows, and the split is neighbour-stable, so the differing record is a training row in both
pairs and the test rows are the same), PromptPATE's data-dependent accounting (`pate-dd`), runs refused over
the dataset's budget and over PromptPATE's epsilon cap (`refused`), and PromptDPSGD with every kind
(`soft-prompt` in `run`, `prefix`, `lora`, `full`).

The changed record adds two checks to the added one: `COUNT` fields stay unmasked (a count may move when a
record is added, never when one is changed), and, in a file without an id column, the record is renamed (its
content is its name), so it leaves its place in every keyed order and partition while |D| stays. So it runs
where that reaches code no other changed run does (`CHANGED_TOO`): the commands on a file without an id
column (`generate`, `hub`, `audit`, `tune-lora`: Algorithm 1's and PromptDPSGD's plans, the audit's design,
their counts), and `methods` (AdaDPSyn, DP-OPT and DP-ICL, which no other command here runs). Not for the
others: `run` composes DP few-shot generation, PromptPATE and PromptDPSGD, whose counts come from the plans
`generate` and `tune-lora` check on a changed record, and `release` reads `run`'s folders; PromptPATE's
outputs declare no `COUNT` field of their own (its noise is set, not derived from |D|), so on D plus one
record `pate`, `pate-dd` and the cap in `refused` are compared as strictly as on a changed one (and the
budget refusal reads no record); `tune` (prefix) and `tune-full` train
and plan with `tune-lora`'s code; `evaluate` reads D's demos and the carved test rows, which neither record
enters.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import io
import json
import logging
import math
import re
import sqlite3
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_support import home, prefect_harness, share_tiny_model, write_hub_task  # noqa: F401

from dpcore import public_outputs
from dpcore.data.taskspec import TASKS_DIR
from dpcore.public_outputs import Kind

pytestmark = pytest.mark.usefixtures("prefect_harness")

VARIANTS = ("D", "added", "changed")
# the commands also run on D with one record changed (the module's docstring says why these)
CHANGED_TOO = frozenset({"generate", "hub", "audit", "tune-lora", "methods"})
# what may differ for a changed record; for an added one, the public counts too
MASKED_CHANGED = frozenset({Kind.DP, Kind.VERDICT, Kind.IDENTITY, Kind.PUBLIC_TIMING})
MASKED_ADDED = MASKED_CHANGED | {Kind.COUNT}

DATA_ROWS_PER_LABEL = 20
LABELS = ("World", "Sports", "Business", "Technology")
ADDED_TEXT = "A record only the neighbouring dataset holds: rare words zygomorphic quetzal filibuster"
CHANGED_TEXT = "A changed record: its text differs in the neighbouring dataset, zygomorphic quetzal"

# ------------------------------------------------------------------ the datasets


def _datasets(folder: Path) -> dict:
    """D, D plus one record and D with one record changed, as user files with and without an id column,
    the task YAMLs (a carved test split: `test_size` 0.2) and the public files beside them."""
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    shipped = load_dataset(load_task_spec("agnews"))
    train = pd.concat([shipped.train[shipped.train["label"] == label].head(DATA_ROWS_PER_LABEL) for label in LABELS])
    train = train[["id", "text", "label"]].reset_index(drop=True)
    public = shipped.public.reset_index(drop=True)
    test = public.iloc[:12][["id", "text", "label"]]  # a public test file: accuracies on it are DP post-processing
    validation = public.iloc[12:24][["id", "text", "label"]]
    queries = public.iloc[24:60][["text"]]
    added = pd.concat([train, pd.DataFrame({"id": ["neighbour-added"], "label": ["World"], "text": [ADDED_TEXT]})],
                      ignore_index=True)
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="neighbours", source={"type": "file", "path": str(folder / "source.csv"), "text_column": "text",
                                           "label_column": "label", "id_column": "id"},
                split={"test_size": 0.2, "seed": 0})
    (folder / "neighbours.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    train.to_csv(folder / "source.csv", index=False)  # the YAML's own file: every command passes --data-path
    # the changed record: a training row of the carved split (a test row is no neighbour of the training rows)
    carved = set(load_dataset(load_task_spec(str(folder / "neighbours.yaml")), str(folder / "source.csv")).train["id"])
    row = int(train.index[train["id"].isin(carved)][3])
    changed = train.copy()
    changed.loc[row, "text"] = CHANGED_TEXT
    files: dict = {"data": {}, "noid": {}, "changed_row": row}
    for name, frame in (("D", train), ("added", added), ("changed", changed)):
        frame.to_csv(folder / f"{name}.csv", index=False)
        frame[["text", "label"]].to_csv(folder / f"noid-{name}.csv", index=False)
        files["data"][name] = str(folder / f"{name}.csv")
        files["noid"][name] = str(folder / f"noid-{name}.csv")
    test.to_csv(folder / "test.csv", index=False)
    validation.to_csv(folder / "validation.csv", index=False)
    queries.to_csv(folder / "queries.csv", index=False)
    train[["text", "label"]].to_csv(folder / "noid-source.csv", index=False)
    spec.update(name="neighbours-noid", source={"type": "file", "path": str(folder / "noid-source.csv"), "text_column": "text",
                                                "label_column": "label"})
    (folder / "neighbours-noid.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    files.update(spec=str(folder / "neighbours.yaml"), noid_spec=str(folder / "neighbours-noid.yaml"),
                 test=str(folder / "test.csv"), validation=str(folder / "validation.csv"),
                 queries=str(folder / "queries.csv"), folder=str(folder))
    # a hub-type source (a local folder of data files `datasets` reads), without an id column: its records are
    # named by their content like a file's, so the neighbour moves no other record
    files["hub"] = {name: str(write_hub_task(folder / f"hub-{name}", frame[["text", "label"]], name="neighbours-hub"))
                    for name, frame in (("D", train), ("added", added), ("changed", changed))}
    return files


def _data_flags(files: dict, variant: str, shape: str = "public-test") -> list[str]:
    """The data flags of one shape: `public-test` (an id column, a public test file), `carved` (an id column,
    the test split carved out of the file) or `noid` (no id column, a public test file)."""
    if shape == "noid":
        data = ["--task-spec", files["noid_spec"], "--dataset", "neighbours-noid", "--data-path",
                files["noid"][variant]]
    else:
        data = ["--task-spec", files["spec"], "--dataset", "neighbours", "--data-path", files["data"][variant]]
    test = [] if shape == "carved" else ["--test-path", files["test"]]
    return [*data, *test, "--model", "tiny-random", "--delta", "1e-3", "--seed", "5"]


GENERATION = ["--num-subsets", "2", "--subset-size", "1", "--top-k", "10", "--max-tokens", "3"]
# the fewest that exercise every output: a flock of 4 teachers, 4 labelled queries, a choice of 2 students
PATE = ["--pate-teachers", "4", "--pate-queries", "4", "--pate-sigma1", "50", "--pate-sigma2", "50",
        "--pate-threshold", "0", "--pate-repeats", "1", "--pate-student-candidates", "2"]
PATE_FLAGS = ["--teachers", "4", "--queries", "4", "--sigma1", "50", "--sigma2", "50", "--threshold", "0",
              "--repeats", "1", "--student-candidates", "2"]
DPSGD = ["--dpsgd-length", "2", "--dpsgd-steps", "2", "--dpsgd-batch-size", "8", "--dpsgd-validation-size", "6"]
TUNE = ["--epsilon", "1", "--steps", "2", "--batch-size", "8", "--validation-size", "6", "--test-size", "6"]


def _commands(files: dict, variant: str, run_ids: dict) -> dict[str, list[list[str]]]:
    """Every command that writes public output, as the invocations of one variant (a command's outputs are
    read together)."""
    ds = ["--dataset-id", f"nb-{variant}"]
    out = home() / "out"  # the commands' --out folders: under the home, read with every other public file
    demos = run_ids.get("demos_of_D", "")  # every variant evaluates D's generated (public, DP) demos
    public = ["--public-path", files["queries"]]
    validation = ["--validation-path", files["validation"]]
    return {
        "run": [["run", *_data_flags(files, variant), *ds, "--methods", "tang,pate,dpsgd", "--epsilons", "1",
                 "--run-id", f"nb-run-{variant}", "--baselines", "zero-shot", "--seeds", "1", "--shots", "2",
                 *GENERATION, *PATE, "--pate-public-path", files["queries"], *DPSGD, "--dpsgd-validation-path",
                 files["validation"], "--audit", "--audit-mode", "run-demos", "--audit-trials", "2",
                 "--audit-demo-sets", "1", "--audit-members", "4", "--audit-reference-prompts", "0",
                 "--no-audit-reference", "--yes", "--json"]],
        # the registered methods (`tasks.methods`): AdaDPSyn's demonstrations, DP-OPT's instruction and DP-ICL's
        # answers to the test items, their plans, rows and results tables, in one run and one charge
        "methods": [["run", *_data_flags(files, variant), *ds, "--methods", "adadpsyn,dp-opt,dp-icl", "--epsilons",
                     "1", "--run-id", f"nb-methods-{variant}", "--baselines", "zero-shot", "--seeds", "1", "--shots",
                     "2", *GENERATION, "--dp-opt-preset", "cpu", "--dp-opt-max-tokens", "2", "--dp-icl-subsets", "2",
                     "--dp-icl-shots", "2", "--no-audit", "--no-audit-reference", "--yes", "--json"]],
        "generate": [["generate", *_data_flags(files, variant, "noid"), *ds, "--epsilon", "1", *GENERATION,
                      "--shots", "1", "--out", str(out / f"generate-{variant}"), "--json"]],
        "pate": [["pate", *_data_flags(files, variant, "carved"), *ds, "--epsilon", "1", *PATE_FLAGS, *public,
                  "--test-size", "6", "--run-id", f"nb-pate-{variant}", "--json"]],
        "pate-dd": [["pate", *_data_flags(files, variant), *ds, "--epsilon", "1000", *PATE_FLAGS, *public,
                     "--test-size", "6", "--accounting", "data-dependent", "--run-id", f"nb-pate-dd-{variant}",
                     "--json"]],
        "tune": [["tune", *_data_flags(files, variant, "carved"), *ds, *TUNE, "--kind", "prefix", "--length", "2",
                  *validation, "--run-id", f"nb-tune-{variant}", "--json"]],
        # the DP fine-tuning baselines: their adapter files, manifests and accuracies are DP outputs like a prompt
        "tune-lora": [["tune", *_data_flags(files, variant, "noid"), *ds, *TUNE, "--kind", "lora", "--rank", "2",
                       *validation, "--run-id", f"nb-tune-lora-{variant}", "--json"]],
        "tune-full": [["tune", *_data_flags(files, variant), *ds, *TUNE, "--kind", "full", *validation,
                       "--run-id", f"nb-tune-full-{variant}", "--json"]],
        "evaluate": [["evaluate", *_data_flags(files, variant, "carved"), "--demos", demos, "--seeds", "1",
                      "--shots", "2", "--out", str(out / f"evaluate-{variant}"), "--json"]],
        "hub": [["generate", "--task-spec", files["hub"][variant], "--dataset", "neighbours-hub", "--test-path",
                 files["test"], "--model", "tiny-random", "--delta", "1e-3", "--seed", "5", *ds, "--epsilon", "1",
                 *GENERATION, "--shots", "1", "--out", str(out / f"hubgen-{variant}"), "--json"]],
        "audit": [["audit", *_data_flags(files, variant, "noid"), *ds, "--epsilon", "1", *GENERATION, "--trials",
                   "2", "--audit-members", "4", "--audit-demo-sets", "1", "--audit-reference-prompts", "0",
                   "--out", str(out / f"audit-{variant}"), "--json"]],
        "release": [["release", "--run", f"nb-run-{variant}", "--method", "dpsgd", "--audit-only", "--trials", "2",
                     "--audit-members", "4", "--audit-reference-prompts", "0", "--json"]],
        # refused: over the dataset's budget (before any record is read), and PromptPATE's data-dependent
        # labelling over its --epsilon cap (the release charged, no label published)
        "refused": [["ledger", "set-budget", "--dataset", f"nb-refused-{variant}", "--epsilon", "0.5", "--delta",
                     "1e-3", "--json"],
                    ["generate", *_data_flags(files, variant), "--dataset-id", f"nb-refused-{variant}", "--epsilon",
                     "1", *GENERATION, "--out", str(out / f"refused-{variant}"), "--json"],
                    ["pate", *_data_flags(files, variant), "--dataset-id", f"nb-cap-{variant}", "--epsilon",
                     run_ids.get("cap_epsilon", ""), *PATE_FLAGS, *public, "--test-size", "6", "--accounting",
                     "data-dependent", "--run-id", f"nb-cap-{variant}", "--json"]],
    }


COMMANDS = ("run", "methods", "generate", "hub", "pate", "pate-dd", "tune", "tune-lora", "tune-full", "evaluate",
            "audit", "release", "refused")
# the names this test gives each variant's runs and folders (normalised: they differ by construction)
RUN_NAMES = ("nb-run", "nb-methods", "nb-pate-dd", "nb-pate", "nb-tune-lora", "nb-tune-full", "nb-tune", "nb-refused", "nb-cap")


def _cap_epsilon(files: dict) -> str:
    """An epsilon just above what PromptPATE's data-dependent release alone costs: the labelling, whatever
    its released cost, goes over it (the refusal after the release's charge)."""
    from dpcore.config import RunConfig
    from tasks.run_plans import build_run_plan

    # the release's cost is a function of the settings and delta alone: planned on the public validation file,
    # so no variant's records are read (nor remembered in the ledger) before its own commands
    config = RunConfig(dataset="neighbours", task_spec=files["spec"], data_path=files["validation"],
                       test_path=files["test"], model="tiny-random", delta=1e-3, seed=5, epsilons=[1000.0],
                       methods=["pate"], pate_teachers=4, pate_queries=4, pate_sigma1=50, pate_sigma2=50,
                       pate_threshold=0, pate_repeats=1, pate_student_candidates=2,
                       pate_public_path=files["queries"], test_size=6, pate_accounting="data-dependent")
    plan = build_run_plan(config, methods=("pate",))
    return f"{plan.method_plan('pate').plans[0].parameters['epsilon_release'] * 1.0001:.6g}"


# ------------------------------------------------------------------ what a command made public

UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{32}\b")
TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T _]\d{2}[:\-]?\d{2}[:\-]?\d{2}(\.\d+)?(\+\d{2}:?\d{2}|Z)?|\b\d{8}T\d{6}Z?\b")
# a log line's clock (`14:03:12.345 | INFO | ...`)
CLOCK = re.compile(r"\b\d{2}:\d{2}:\d{2}(\.\d+)?\b")
# columns of MLflow's and the ledger's tables that hold clock values (epoch milliseconds or ISO times)
CLOCK_COLUMNS = re.compile(r"(^|_)(time|timestamp|created|updated|at)$|_time$|^creation_time$")
# Not read: the shared model files and caches of other libraries, the accountant's cache (shared with the other
# test processes; keyed by public parameters), the suite's CA file.
SKIPPED = ("private", "models", "hf", "config", "cache/accounting", "cache/xdg", "prefect-api-ca.pem")
LOG_LINE = re.compile(r"\| (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\||^\d{4}/\d{2}/\d{2} .*\b(DEBUG|INFO|WARNING)\b")


def _skipped(rel: str) -> bool:
    return any(rel == s or rel.startswith(s + "/") for s in SKIPPED)


def _snapshot() -> dict:
    """Every file under the home (outside what is not read), by path: (mtime, size), and every SQLite
    database's rows."""
    root = home()
    files, databases = {}, {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if _skipped(rel) or not path.is_file():
            continue
        files[rel] = (path.stat().st_mtime_ns, path.stat().st_size)
        if path.suffix == ".db":
            databases[rel] = _database_rows(path)
    return {"files": files, "databases": databases}


def _database_rows(path: Path) -> dict[str, set[str]]:
    """Each table's rows, as JSON texts (read through SQLite: a database is shared by every command)."""
    rows: dict[str, set[str]] = {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cursor = db.execute(f'SELECT * FROM "{table}"')  # noqa: S608 (the database's own table names)
            names = [d[0] for d in cursor.description]
            rows[table] = {json.dumps({n: (base64.b64encode(v).decode() if isinstance(v, bytes) else v)
                                       for n, v in zip(names, row, strict=True)}, sort_keys=True, default=str)
                           for row in cursor}
    return rows


def _tensors(state) -> object:
    """Tensors by shape, dtype and content digest (a file of tensors compared by content)."""
    import torch

    if isinstance(state, torch.Tensor):
        data = state.detach().cpu().contiguous()
        return {"shape": list(data.shape), "dtype": str(data.dtype),
                "sha256": hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()}
    if isinstance(state, dict):
        return {str(k): _tensors(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return [_tensors(v) for v in state]
    return state if isinstance(state, str | int | float | bool | type(None)) else repr(state)


def _decode(path: Path, appended_from: int = 0) -> object:
    """A public file's content: Parquet as records, JSON as objects, tensor files by content, SQLite by the
    rows a command added (elsewhere), other files as text (from `appended_from`: a log's new lines)."""
    if path.suffix == ".parquet":
        return pd.read_parquet(path).to_dict(orient="records")
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            return {"metadata": {k: _maybe_json(v) for k, v in metadata.items()},
                    "tensors": {k: _tensors(handle.get_tensor(k)) for k in handle.keys()}}  # noqa: SIM118
    if path.suffix == ".pt":
        import torch

        return _tensors(torch.load(path, map_location="cpu", weights_only=False))
    data = path.read_bytes()
    try:
        return data[appended_from:].decode()
    except UnicodeDecodeError:
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _maybe_json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _public_files(before: dict) -> tuple[dict, dict]:
    """(every file written or changed outside the private store since `before`, decoded; the rows each
    SQLite database gained)."""
    root, after = home(), _snapshot()
    found = {}
    for rel, (mtime, size) in after["files"].items():
        old = before["files"].get(rel)
        if old == (mtime, size) or rel.endswith((".db", ".db-wal", ".db-shm", ".db-journal", ".lock")):
            continue
        grew = old is not None and size > old[1] and Path(rel).suffix in (".log", ".txt", "")
        found[rel] = _decode(root / rel, old[1] if grew else 0)
    rows = {}
    for rel, tables in after["databases"].items():
        gained = {t: sorted(r - before["databases"].get(rel, {}).get(t, set())) for t, r in tables.items()}
        rows[rel] = {t: [json.loads(r) for r in new] for t, new in gained.items() if new}
    return found, {rel: t for rel, t in rows.items() if t}


def _markdown(text: str) -> dict:
    """A markdown artifact as its lines outside tables and its tables' rows by header."""
    lines, tables, header = [], [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            header = None
            lines.append(line)
        elif header is None:
            header = cells
            tables.append([])
        elif not set("".join(cells)) <= set("-: "):
            tables[-1].append(dict(zip(header, cells, strict=False)))
    return {"lines": lines, "tables": tables}


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
    return sorted(({"key": a.key, "type": a.type, "description": a.description,
                    "data": _markdown(a.data) if a.type == "markdown" else _maybe_json(a.data)
                    if isinstance(a.data, str) else a.data} for a in artifacts), key=lambda a: str(a["key"]))


RUN_NAME = re.compile(r"((?:sub)?flow run|[Tt]ask run) '[^']+'")
LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "dpicl", "tasks", "flows", "dpcore")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records = []

    def emit(self, record):
        if record not in self.records:  # a record may reach two of the loggers it is attached to
            self.records.append(record)


def _log_lines(records) -> list[str]:
    """The log lines, with Prefect's random run names and its cache-hit wording (a stage whose inputs are
    public counts is served from the cache when the counts are unchanged) normalised."""
    return sorted({RUN_NAME.sub(r"\1 <NAME>", r.getMessage()).replace("Cached(type=COMPLETED)", "Completed()")
                   for r in records})


def _run(main, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _invoke(main, argv: list[str], handler: _Collect) -> dict:
    """One invocation: what it printed, logged and wrote outside the private store."""
    from prefect import tags

    before = _snapshot()
    handler.records.clear()
    tag = f"neighbours-{uuid.uuid4().hex}"
    with tags(tag):  # the command's flow runs, among those of the other test process
        code, out, err = _run(main, argv)
    assert code in (0, 1, 3), f"{argv[:2]}: exit {code}: {err[-2000:]}"
    files, rows = _public_files(before)
    summary = json.loads(out) if out.strip().startswith("{") else {"stdout": out}
    run_tag = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--run-id"), None)
    return {"command": argv[0], "exit": code, "json": summary, "stderr": [line for line in err.splitlines()
                                                      if "\r" not in line and not LOG_LINE.search(line)],
            "logs": _log_lines(handler.records), "files": files, "databases": rows, "mlflow": _mlflow(run_tag),
            "artifacts": _prefect_artifacts(tag)}


# The commands split over two test modules (this one and test_neighbours_commands.py), which xdist runs in two
# processes at once: the whole comparison is minutes of runs on the tiny model.
COMMANDS_HERE = ("run", "methods", "release")


@pytest.fixture(scope="module")
def neighbour_runs(tiny_lm, tmp_path_factory):
    return collect_neighbour_runs(tiny_lm, tmp_path_factory, COMMANDS_HERE)


def collect_neighbour_runs(tiny_lm, tmp_path_factory, commands) -> dict:
    """`commands` on every variant: {command: {variant: [what each invocation made public]}}."""
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    from flows.cli import main

    share_tiny_model(tiny_lm)
    files = _datasets(tmp_path_factory.mktemp("neighbours"))
    _differing_records_are_training_rows(files)
    outputs: dict[str, dict[str, list[dict]]] = {}
    run_ids: dict = {"cap_epsilon": _cap_epsilon(files)} if "refused" in commands else {}
    handler = _Collect()
    for name in LOGGERS:  # the run's own loggers, whatever propagation other tests set up
        logging.getLogger(name).addHandler(handler)
    # every stage computes in every variant: a stage served from a cache an earlier test (or variant) filled
    # logs nothing of its own, a difference of caching, not of the data
    # MLflow's store and the ledger created before the first snapshot: their schema rows are no command's output
    from tasks.tracking import experiment_id, mlflow_client

    for dataset in ("neighbours", "neighbours-noid", "neighbours-hub"):
        experiment_id(mlflow_client(), dataset)
    _run(main, ["ledger", "show", "--json"])
    refresh = temporary_settings(updates={PREFECT_TASKS_REFRESH_CACHE: True})
    refresh.__enter__()
    try:
        # the commands that also run on a changed record first: each then finds the ledger of its dataset id as
        # the same commands left it in every variant
        ordered = sorted(commands, key=lambda command: command not in CHANGED_TOO)
        for variant in VARIANTS:
            for command in ordered:  # built one at a time: evaluate reads the demos generate wrote for D
                if variant == "changed" and command not in CHANGED_TOO:
                    continue
                invocations = []
                for argv in _commands(files, variant, run_ids)[command]:
                    invocations.append(_invoke(main, argv, handler))
                if command == "generate" and variant == "D":
                    run_ids["demos_of_D"] = str(Path(invocations[0]["json"]["out"]) / "demos.parquet")
                outputs.setdefault(command, {})[variant] = invocations
    finally:
        refresh.__exit__(None, None, None)
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(handler)
    if "run" in outputs:
        keys = {a["key"] for a in outputs["run"]["D"][0]["artifacts"]}
        assert keys >= {"dp-fewshot-summary", "dp-fewshot-results", "prompt-pate-results"}, keys
    if "refused" in outputs:
        refused = [i["exit"] for i in outputs["refused"]["D"]]
        assert refused[1:] == [3, 3], f"the refused runs were not refused: {refused}"
    return outputs


def _differing_records_are_training_rows(files: dict) -> None:
    """In the carved split the added and the changed record are training rows (a keyed hash of the id: the
    other rows keep their part), so both pairs are neighbours on the training rows, with the same test rows."""
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    spec = load_task_spec(files["spec"])
    loaded = {v: load_dataset(spec, files["data"][v]) for v in VARIANTS}
    assert "neighbour-added" in set(loaded["added"].train["id"])
    changed_id = pd.read_csv(files["data"]["changed"])["id"].iloc[files["changed_row"]]
    assert changed_id in set(loaded["changed"].train["id"])
    assert all(set(loaded[v].test["id"]) == set(loaded["D"].test["id"]) for v in VARIANTS)


# ------------------------------------------------------------------ the comparison


def _identities(value, path: tuple[str, ...] = (), found: set | None = None, declared=None) -> set[str]:
    """The string values at `IDENTITY` paths of one output (keyed data hashes, cache keys): normalised wherever
    else they are quoted (a folder name, a cache key's path)."""
    found = set() if found is None else found
    if isinstance(value, dict):
        for k, v in value.items():
            _identities(v, (*path, str(k)), found, declared)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _identities(v, (*path, str(i)), found, declared)
    elif isinstance(value, str) and len(value) >= 12 and any(
            kind == Kind.IDENTITY and public_outputs.matches(p, path) for p, kind in (declared or {}).items()):
        found.add(value)
    return found


class _Normaliser:
    """The run's own names (this test's variant names, uuids, clock times, declared identities) normalised;
    declared fields masked at their paths; nothing else touched."""

    def __init__(self, variant: str, masked: frozenset, identities: set[str]):
        self.variant, self.masked = variant, masked
        self.identities = sorted({i for value in identities for i in (value, value[:12]) if len(i) >= 12},
                                 key=len, reverse=True)
        self.lines = [(re.compile(p), k) for p, k in public_outputs.declared_lines().items() if k in masked]

    def text(self, value: str) -> str:
        v = self.variant
        for name in RUN_NAMES:
            value = value.replace(f"{name}-{v}", f"<{name}>")
        value = value.replace("generate-D/demos.parquet", "<generate>/demos.parquet")  # evaluate reads D's demos
        for folder in ("hubgen", "generate", "evaluate", "audit", "refused", "hub"):
            value = value.replace(f"{folder}-{v}", f"<{folder}>")
        value = value.replace(f"nb-{v}", "<DS>").replace(f"noid-{v}.csv", "<NOID>.csv").replace(f"{v}.csv", "<DATA>.csv")
        for identity in self.identities:
            value = value.replace(identity, "<ID>")
        return UUID.sub("<UUID>", TIME.sub("<TIME>", value))

    def line(self, value: str) -> str:
        value = self.text(value)
        for pattern, kind in self.lines:
            value = pattern.sub(lambda m, mask=f"<{kind}>": _mask_groups(m, mask), value)
        return CLOCK.sub("<CLOCK>", value)

    def value(self, value, declared: dict, path: tuple[str, ...] = ()):
        if any(kind in self.masked and public_outputs.matches(p, path) for p, kind in declared.items()):
            return "<masked>"
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v, declared, (*path, str(k))) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v, declared, (*path, str(i))) for i, v in enumerate(value)]
        if isinstance(value, str):
            stripped = value.strip()
            if stripped[:1] in "[{" and len(stripped) > 1:
                try:
                    return self.value(json.loads(stripped), declared, path)
                except json.JSONDecodeError:
                    pass
            return self.text(value)
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        return value


def _mask_groups(match: re.Match, mask: str) -> str:
    text, start = match.group(0), match.start(0)
    out, last = "", 0
    for i in range(1, (match.re.groups or 0) + 1):
        if match.start(i) < 0:
            continue
        out += text[last:match.start(i) - start] + mask
        last = match.end(i) - start
    return out + text[last:]


def _file_declarations(rel: str) -> dict:
    found: dict = {}
    for output, paths in public_outputs.declared_outputs().items():
        if output.startswith("file:") and fnmatch.fnmatch(rel, output[len("file:"):]):
            found.update(paths)
    return found


# MLflow's store holds the runs' params, metrics and tags as rows (key, value): declared once, as `mlflow`
MLFLOW_TABLES = {"params": "params", "tags": "tags", "metrics": "metrics", "latest_metrics": "metrics"}


def _row_declarations(table: str, row: dict) -> dict:
    if table in MLFLOW_TABLES and "key" in row:
        section = MLFLOW_TABLES[table]
        kinds = [kind for p, kind in public_outputs.declared("mlflow").items()
                 if len(p) == 3 and p[1] == section and fnmatch.fnmatchcase(str(row["key"]), p[2])]
        return {("value",): kinds[0]} if kinds else {}
    return public_outputs.declared(f"sqlite:{table}")


def _normal_rows(tables: dict, n: _Normaliser) -> dict:
    out = {}
    for table, rows in tables.items():
        normal = []
        for row in rows:
            row = {k: ("<CLOCK>" if CLOCK_COLUMNS.search(k) and v is not None else v) for k, v in row.items()}
            normal.append(json.dumps(n.value(row, _row_declarations(table, row)), sort_keys=True, default=str))
        out[table] = sorted(normal)
    return out


def _normal_files(files: dict, n: _Normaliser) -> dict:
    """Files by their normalised names; files whose names normalise alike (stage folders named by a key) are
    told apart by their normalised content."""
    grouped: dict[str, list] = {}
    for rel, value in files.items():
        name = n.text(rel)
        grouped.setdefault(name, []).append(n.value(value, _file_declarations(name)))
    out = {}
    for name, values in grouped.items():
        values.sort(key=lambda v: json.dumps(v, sort_keys=True, default=str))
        out.update({name if len(values) == 1 else f"{name}#{i}": v for i, v in enumerate(values)})
    return out


def _normal_artifact(artifact: dict, n: _Normaliser) -> dict:
    data = artifact["data"]
    if isinstance(data, dict) and "lines" in data:  # a markdown artifact's text lines: declared as lines
        data = {**data, "lines": [n.line(line) for line in data["lines"]]}
    return n.value({**artifact, "data": data}, public_outputs.declared(f"artifact:{artifact['key']}"))


def _normal_outputs(run: dict, n: _Normaliser) -> dict:
    return {
        "exit": run["exit"],
        "json": n.value(run["json"], public_outputs.declared(f"json:{run['command']}")),
        "stderr": sorted(n.line(line) for line in run["stderr"]),
        "logs": sorted({n.line(line) for line in run["logs"]}),
        "mlflow": n.value(run["mlflow"], public_outputs.declared("mlflow")),
        "artifacts": [_normal_artifact(a, n) for a in run["artifacts"]],
        "databases": {n.text(rel): _normal_rows(tables, n) for rel, tables in run["databases"].items()},
        "files": _normal_files(run["files"], n),
    }


def _all_identities(run: dict) -> set[str]:
    found = _identities(run["json"], declared=public_outputs.declared(f"json:{run['command']}"))
    for rel, value in run["files"].items():
        _identities(value, found=found, declared=_file_declarations(rel))
        parts = Path(rel).parts
        if parts[:2] == ("cache", "stages") and len(parts) > 3:
            found.add(parts[3])  # a stage's cache key: a digest of its inputs, the data hash among them
    _identities(run["mlflow"], found=found, declared=public_outputs.declared("mlflow"))
    for tables in run["databases"].values():
        for table, rows in tables.items():
            for row in rows:
                _identities(row, found=found, declared=_row_declarations(table, row))
    return found


def _compare(outputs: dict, variant: str, masked: frozenset) -> list[str]:
    """The public outputs of `variant` that differ from D's, once normalised: [] when none. `outputs`:
    {variant: [one dict per invocation]} of one command."""
    problems = []
    base, other = outputs["D"], outputs[variant]
    if len(base) != len(other):
        return [f"{len(base)} invocations on D, {len(other)} on {variant}"]
    for i, (a_run, b_run) in enumerate(zip(base, other, strict=True)):
        a = _normal_outputs(a_run, _Normaliser("D", masked, _all_identities(a_run)))
        b = _normal_outputs(b_run, _Normaliser(variant, masked, _all_identities(b_run)))
        for part in ("exit", "json", "stderr", "logs", "mlflow", "artifacts", "databases"):
            if a[part] != b[part]:
                problems.append(f"[{i}] {part}: {_first_difference(a[part], b[part])}")
        if set(a["files"]) != set(b["files"]):
            problems.append(f"[{i}] files: only in D {sorted(set(a['files']) - set(b['files']))}, only in "
                            f"{variant} {sorted(set(b['files']) - set(a['files']))}")
        for name in sorted(set(a["files"]) & set(b["files"])):
            if a["files"][name] != b["files"][name]:
                problems.append(f"[{i}] file {name}: {_first_difference(a['files'][name], b['files'][name])}")
    return problems


def _first_difference(a, b, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key, "<absent>") != b.get(key, "<absent>"):
                return _first_difference(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{where}/{key}")
    if isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b) and a != b:
        return f"{where or 'lines'}: only in D {sorted(set(a) - set(b))[:5]}, only in the neighbour {sorted(set(b) - set(a))[:5]}"
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{where}/{i}")
    return f"{where or 'value'}: {str(a)[:300]!r} != {str(b)[:300]!r}"


@pytest.mark.parametrize("command", [c for c in COMMANDS_HERE if c in CHANGED_TOO])
def test_changing_one_record_changes_no_public_output_but_declared_dp_outputs(neighbour_runs, command):
    problems = _compare(neighbour_runs[command], "changed", MASKED_CHANGED)
    assert not problems, f"dpicl {command}: a public output depends on a changed record:\n" + "\n".join(problems)


@pytest.mark.parametrize("command", COMMANDS_HERE)
def test_adding_one_record_changes_no_public_output_but_declared_dp_outputs_and_counts(neighbour_runs, command):
    problems = _compare(neighbour_runs[command], "added", MASKED_ADDED)
    assert not problems, f"dpicl {command}: a public output depends on an added record:\n" + "\n".join(problems)


# ------------------------------------------------------------------ the comparison catches planted leaks


def _planted(neighbour_runs, command: str) -> dict:
    return json.loads(json.dumps(neighbour_runs[command], default=str))


def _file_named(run: dict, suffix: str) -> str:
    (name,) = [name for name in run["files"] if not name.startswith(("mlflow/", "cache/")) and name.endswith(suffix)]
    return name


def test_a_statistic_planted_in_a_log_line_is_caught(neighbour_runs):
    """A log line quoting a private statistic with the wording of a declared DP line elsewhere is still caught:
    line declarations mask their groups only in the line they describe."""
    planted = _planted(neighbour_runs, "run")
    for variant, loss in (("D", "1.2345"), ("added", "1.2351")):
        planted[variant][0]["logs"].append(f"private training loss {loss}")
    assert any("private training loss" in p for p in _compare(planted, "added", MASKED_ADDED))


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
    _differing_records_are_training_rows(files)
