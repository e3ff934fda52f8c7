"""What a person reads on the terminal: one progress line per generation step naming its label, epsilons
and deltas rounded for humans (full precision in --json), errors that name the flag the user typed, a
quiet exit on a closed pipe, PromptPATE's accuracies named for what they are, and what T counts."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from test_cli_experience import DPICL, REPO, _env  # the subprocess harness of the CLI tests

# --------------------------------------------------------------------------- a closed pipe


def test_a_closed_stdout_ends_the_command_quietly(tmp_path):
    """`dpicl ledger show | head`: the reader goes away before dpicl writes; no traceback, exit 141."""
    from dpcore.privacy.ledger import Ledger, Spend

    home = tmp_path / "home"
    home.mkdir()
    book = Ledger(home / "ledger.db")
    book.charge([Spend.sampled_steps("gaussian", 1.0, 0.01, 10, "generate", dataset_id="pipe",
                                     content_hash="c" * 64, run_id=f"run-{i}", delta=1e-5)
                 for i in range(800)], replay_recorded=False)  # ~100 KB: more than a pipe buffer (64 KB) holds,
    # so the command is still writing when the reader goes away, however fast it writes
    proc = subprocess.Popen(DPICL + ["ledger", "show", "--dataset", "pipe"], cwd=tmp_path, env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # `head -1`: one line read, then the pipe is closed
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert proc.returncode == 141, (proc.returncode, err)


# --------------------------------------------------------------------------- one line per generation step


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not any(record is seen for seen in self.records):  # seen by two watched loggers
            self.records.append(record)


@pytest.fixture()
def logs():
    """Every log record of dpicl's loggers (a handler on each: Prefect's logging set-up may stop them from
    propagating to the root logger, where caplog listens)."""
    captured = _Collect()
    watched = [logging.getLogger(name) for name in ("", "dpcore", "dpicl", "tasks", "flows", "prefect")]
    levels = [logger.level for logger in watched]
    for logger in watched:
        logger.addHandler(captured)
        logger.setLevel(logging.DEBUG)
    try:
        yield captured.records
    finally:
        for logger, level in zip(watched, levels, strict=True):
            logger.removeHandler(captured)
            logger.setLevel(level)


def _step_lines(records, steps: int) -> dict[int, list[str]]:
    """The INFO lines of each generation step k ("step k/steps"), from any logger."""
    lines: dict[int, list[str]] = {k: [] for k in range(1, steps + 1)}
    for record in records:
        if record.levelno < logging.INFO:
            continue
        message = record.getMessage()
        for k in lines:
            if f"step {k}/{steps}" in message:
                lines[k].append(message)
    return lines


def test_the_generate_stage_logs_each_step_once_with_its_label(tiny_lm, logs, one_thread):
    """In a pipeline run, labels generate in parallel tasks: a step line that does not name its label (or two
    lines for one step) cannot be told apart."""
    import pandas as pd
    from pipeline_support import share_tiny_model

    from dpcore.data.artifacts import write_table
    from dpcore.fewshot.config import GenerationConfig
    from dpcore.home import private_dir
    from tasks import generate as generate_stage

    share_tiny_model(tiny_lm)
    rows = [{"split": "train", "id": f"{label}-{i}", "text": f"{label} record {i} about markets", "label": label}
            for label in ("World", "Sports") for i in range(12)]
    records = write_table(pd.DataFrame(rows), private_dir() / "tests" / "step-lines" / "records.parquet")
    generate_stage.generate.fn(
        records_path=str(records), data_hash="d" * 64, task_spec="agnews", method="tang", label="Sports",
        epsilon=1.0, noise_multiplier=2.0, generation=GenerationConfig(num_subsets=2, subset_size=2, top_k=20,
                                                                       max_tokens=4),
        model="tiny-random", seed=3, noise_scope="seed:3", noise_charged=True)
    lines = _step_lines(logs, 4)
    assert all(len(found) == 1 for found in lines.values()), lines
    assert all("Sports" in found[0] and "eps=1" in found[0] for found in lines.values()), lines


def test_dpicl_generate_logs_each_step_once_with_the_labels(tiny_model_dir, cli, logs, one_thread):
    code, out, err = cli(["generate", "--dataset", "agnews", "--dataset-id", "step-lines", "--epsilon", "2",
                          "--model", str(tiny_model_dir), "--shots", "8", "--max-tokens", "3", "--num-subsets",
                          "2", "--subset-size", "1", "--top-k", "20", "--seed", "1"])
    assert code == 0, err
    lines = _step_lines(logs, 3)
    assert all(len(found) == 1 for found in lines.values()), lines
    assert all("World" in found[0] and "Technology" in found[0] for found in lines.values()), lines
    # 8 shots over 4 labels: 2 demos per label of 3 tokens each, so 6 mechanism steps per label: said as such
    first = out.splitlines()[0]
    assert "T = 6 mechanism steps (3 tokens per demo x 2 demos per label)" in first, first


# --------------------------------------------------------------------------- what T counts


def test_the_calibration_log_says_what_t_counts_and_rounds_its_epsilons(logs):
    """T is every mechanism step of a label: tokens per demo x demos per label, not the tokens of one demo."""
    from dpcore.fewshot.config import GenerationConfig
    from dpcore.fewshot.plan import fewshot_plan
    from tasks.calibrate import log_calibrations

    generation = GenerationConfig(num_subsets=10, subset_size=2, max_tokens=20, demos_per_label=2)
    log_calibrations(fewshot_plan([3.0], {"a": 30000, "b": 30000}, generation, 1e-5), generation)
    (line,) = [r.getMessage() for r in logs if r.getMessage().startswith("epsilon 3:")]
    assert "T = 40 mechanism steps (20 tokens per demo x 2 demos per label)" in line, line
    upper = line.split("accountant upper ")[1].split(",")[0]
    assert len(upper.replace(".", "")) <= 4, line  # not 2.998361328681111
    assert "delta 1e-05" in line, line


# --------------------------------------------------------------------------- PromptPATE's accuracies


def _pate_summary(calibrated: bool = True) -> dict:
    return {"dataset": "agnews", "teachers": 10, "shots": 1, "threshold": 9.0, "sigma1": 5.0, "sigma2": 3.0,
            "vote_mode": "calibrated", "public": "iid", "queries": 20, "answered": [12],
            "accuracy": {"mean": 0.61, "std": 0.0, "per_repeat": [0.61], "n": 100, "calibrated": calibrated},
            "baselines": {"zero-shot": 0.4}, "epsilon": 2.0570712345, "delta": 1e-5,
            "student_prompt": [{"text": "public query", "label": "World"}], "seeded_noise": False,
            "run_id": "r", "run_dir": "/runs/r"}


def test_the_pate_summary_says_which_accuracy_it_shows():
    from flows.cli.pate import format_summary

    text = format_summary(_pate_summary(calibrated=True))
    assert "student calibrated accuracy 0.610" in text and "baseline zero-shot: calibrated accuracy 0.400" in text
    assert "epsilon 2.057 " in text and "2.05707" not in text and "delta 1e-05" in text
    raw = format_summary(_pate_summary(calibrated=False))
    assert "student raw accuracy 0.610" in raw and "baseline zero-shot: raw accuracy 0.400" in raw


def test_the_run_table_names_raw_and_calibrated_accuracy_and_rounds_epsilons():
    from flows.cli.run import format_cost, format_results

    row = {"method": "pate", "epsilon": 2.0570712345, "noise_multiplier": None, "accuracy_mean": 0.5,
           "accuracy_std": 0.01, "calibrated_accuracy_mean": 0.6, "calibrated_accuracy_std": 0.02, "n": 100,
           "seeds": 1, "audit": None}
    summary = {"methods": ["tang", "pate"], "results": [row], "delta": 1.0e-5, "seeded_noise": False,
               "run_id": "r", "mlflow_run_id": "m", "tracking_uri": "sqlite://", "run_dir": "/x",
               "audit": {"ran": False},
               "ledger_after": {"dataset_id": "agnews", "epsilon": 5.083062773, "delta": 1e-5, "entries_this_run": 2,
                                "entries_total": 2, "purposes_this_run": ["pipeline"],
                                "budget": {"epsilon": 10.0, "delta": 1e-5}}}
    text = format_results(summary)
    header = text.splitlines()[0]
    assert "raw accuracy" in header and "calibrated accuracy" in header, header
    assert "2.057" in text and "2.05707" not in text
    assert "spent epsilon 5.083 at delta 1e-05" in text
    plan = format_cost({"epsilon": 3.0253809462336254, "delta": 1e-5, "methods": {"tang": 1.0, "pate": 2.05707123}})
    assert "epsilon 3.025 at delta 1e-05" in plan and "pate 2.057" in plan and "3.02538" not in plan


# --------------------------------------------------------------------------- epsilons for people


def test_display_rounding():
    from dpcore.display import fmt_delta, fmt_eps, fmt_sigma

    assert [fmt_eps(v) for v in (3.0253809462336254, 2.05707, 8.0, 0.5, float("inf"), None, "inf", 123456.7)] == [
        "3.025", "2.057", "8", "0.5", "inf", "-", "inf", "123457"]
    assert [fmt_delta(v) for v in (1e-5, 8.400067e-06, 0.001)] == ["1e-05", "8.4e-06", "0.001"]
    assert fmt_sigma(0.39817777) == "0.3982"


def test_the_pipelines_ledger_line_rounds_its_epsilons():
    """`ledger agnews: ...; planned cost epsilon 3.0253809462336254; dataset total epsilon 3.5110404502515675`."""
    from flows.pipeline import charge_line

    line = charge_line({"dataset_id": "agnews", "charged": 1, "replayed": 0, "total_epsilon": 3.5110404502515675,
                        "delta": 8.4e-06}, {"epsilon": 3.0253809462336254, "delta": 8.4e-06}, "run-1", 8.4e-06)
    assert "planned cost epsilon 3.025;" in line and "dataset total epsilon 3.511 at delta 8.4e-06" in line, line
    from flows.tune import charge_line as tune_line

    line = tune_line({"dataset_id": "agnews", "charged": 2, "replayed": 0, "total_epsilon": 8.000123456}, "10 x 576")
    assert "dataset total epsilon 8 " in line or "dataset total epsilon 8;" in line, line


def test_release_and_audit_lines_round_epsilons(tmp_path):
    from dpcore.errors import ConfigError
    from dpcore.fewshot.release import choose_release_epsilon

    class Run:
        run_id = "r"
        demos = __import__("pandas").DataFrame({"method": ["tang", "tang"], "epsilon": [1.0, 2.0570712345]})

    with pytest.raises(ConfigError) as refused:
        choose_release_epsilon(Run(), 3.0)
    assert "has DP demos at epsilon 1, 2.057" in str(refused.value), refused.value
    assert choose_release_epsilon(Run(), 2.057) == 2.0570712345  # what the refusal showed is what a person types


# --------------------------------------------------------------------------- errors name the flag


def _raised_texts(path: Path) -> list[tuple[int, str]]:
    """(line, literal text) of every message an exception raised in `path` is built from (the literal parts
    of f-strings: what the code spells out, not the values it formats in)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
            continue
        todo = [node.exc.args[0]]
        while todo:
            part = todo.pop()
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                found.append((node.lineno, part.value))
            elif isinstance(part, ast.JoinedStr):
                todo += [value for value in part.values if isinstance(value, ast.Constant)]
            elif isinstance(part, ast.BinOp):  # "..." + "..."
                todo += [part.left, part.right]
    return found


def test_errors_name_flags_not_config_fields():
    """A message naming a setting says the flag a person types (`--pate-queries (pate_queries)`, through
    `dpcore.config.flag`), never a bare configuration field (`pate_queries: Q must be >= 1`)."""
    import re

    from dpcore.config import RunConfig

    fields = sorted((name for name in RunConfig.flat_names() if "_" in name), key=len, reverse=True)
    bare = re.compile(r"(?<![-.\w])(" + "|".join(fields) + r")(?![-\w])")
    offenders = []
    for folder in ("dpcore", "tasks", "flows"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for line, text in _raised_texts(path):
                if bare.search(text):
                    offenders.append(f"{path.relative_to(REPO)}:{line}: {text.strip()[:80]}")
    assert offenders == []


def test_config_errors_name_the_flag_and_the_field(cli):
    from dpcore.flags import flag

    assert flag("pate_queries") == "--pate-queries (pate_queries)"
    assert flag("rvp") == "--no-rvp (rvp)"
    assert flag("pate_public", "ood") == "--pate-public ood (pate_public: ood)"
    code, out, err = cli(["run", "--dataset", "agnews", "--num-subsets", "0", "--yes"])
    assert code == 2 and "--num-subsets (num_subsets):" in err, err
    code, out, err = cli(["run", "--dataset", "agnews", "--methods", "pate", "--pate-public", "ood",
                          "--pate-public-path", "queries.csv", "--yes"])
    assert code == 2 and "--pate-public-path (pate_public_path)" in err and "--pate-public (pate_public)" in err, err


# --------------------------------------------------------------------------- the own-data guide


def test_the_own_data_guide_is_linked_and_names_real_flags():
    """The README points a user with their own data to docs/own-data.md; every flag either names is one a
    dpicl command takes."""
    import argparse
    import re

    from flows.cli import build_parser

    known = set()

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            known.update(action.option_strings)

    walk(build_parser())
    readme = (REPO / "README.md").read_text()
    guide = (REPO / "docs" / "own-data.md").read_text()
    assert "docs/own-data.md" in readme
    for text in (guide,):
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", text))
        assert flags and flags <= known, flags - known
    for needed in ("--pate-public-path", "--dpsgd-validation-path", "set-budget", "1/|D|"):
        assert needed in guide
