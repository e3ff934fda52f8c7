"""Test session setup: a temporary $DPICL_HOME (nothing is written under ~ or ./.dpicl),
offline-safe Prefect/MLflow settings, and shared model/data fixtures.

The embedded model's conversion and the accountants' answers are kept once per environment
(`<venv>/dpicl-test-cache/`) and linked into every test home.
"""

from __future__ import annotations

import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="dpicl-test-home-")
os.environ["DPICL_HOME"] = _HOME
for _key in ("PREFECT_API_URL", "PREFECT_PROFILES_PATH", "MLFLOW_TRACKING_URI"):
    os.environ.pop(_key, None)
os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
os.environ["HF_HOME"] = os.path.join(_HOME, "hf")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_HOME, "config")
os.environ["XDG_CACHE_HOME"] = os.path.join(_HOME, "cache", "xdg")
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach a hub
os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"

# glibc hands every freed block over 32 MB back to the kernel and maps it again, zeroed, on the next
# allocation: the tiny model's 49k-word logits are such blocks, and the page faults cost over a third of
# the CPU time of test_release_methods.py in the kernel (measured: 137 s of 349 s). Keep freed memory
# in the heap instead, here (mallopt) and in every process the tests start (the environment).
_MALLOC = {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": 16 << 30, "MALLOC_TOP_PAD_": 256 << 20}
for _key, _value in _MALLOC.items():
    os.environ.setdefault(_key, str(_value))
try:
    import ctypes

    _libc = ctypes.CDLL("libc.so.6")
    for _param, _key in ((-4, "MALLOC_MMAP_MAX_"), (-1, "MALLOC_TRIM_THRESHOLD_"), (-2, "MALLOC_TOP_PAD_")):
        _libc.mallopt(_param, int(os.environ[_key]))  # M_MMAP_MAX, M_TRIM_THRESHOLD, M_TOP_PAD
except OSError:  # not glibc: nothing to tune
    pass

import sys  # noqa: E402
from pathlib import Path  # noqa: E402


# Prefect builds a verifying TLS context for every API client it creates, http:// URL or not, from the CA file it
# is given: certifi's whole bundle by default (a client takes 20.8 ms to make, 0.8 ms with one certificate), and the
# suite makes about 300. The suite's Prefect servers are http:// on 127.0.0.1: a CA file of one certificate does.
def _one_certificate_ca_file() -> str:
    import re

    import certifi

    bundle = Path(certifi.where()).read_text()
    path = Path(_HOME) / "prefect-api-ca.pem"
    path.write_text(re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n", bundle, re.S).group(0))
    return str(path)


os.environ.setdefault("PREFECT_API_SSL_CERT_FILE", _one_certificate_ca_file())

import accounting_seed  # noqa: E402
import mlflow_store  # noqa: E402
import prefect_test_server  # noqa: E402
import pytest  # noqa: E402

from dpcore.home import configure_environment  # noqa: E402

configure_environment()

# What the test runs of this environment share (the converted model, the accountants' answers).
_TEST_CACHE = Path(sys.prefix) / "dpicl-test-cache"


def _share_converted_models() -> None:
    """Every test home's `models/` is one folder per environment: the embedded model's GGUF is dequantised once
    (about 20 s) for all sessions and xdist workers of this venv, by the first test that needs it, not once per
    worker per session; the tiny model's tokenizer, which nearly every worker needs first, is read from the GGUF
    alone. `dpcore.lm.models` makes each folder under a lock: a worker that needs a folder another worker is
    making waits for it."""
    import transformers

    from dpcore.lm.models import embedded_gguf

    gguf = embedded_gguf("smollm2-135m").stat()
    key = f"transformers-{transformers.__version__}-gguf-{gguf.st_size}-{gguf.st_mtime_ns}"
    shared = _TEST_CACHE / f"models-{key}"
    try:
        shared.mkdir(parents=True, exist_ok=True)
    except OSError:  # an environment this user cannot write (a system Python): convert per home, as dpicl does
        return
    (Path(_HOME) / "models").symlink_to(shared, target_is_directory=True)


# The accountants' answers on disk (`dpcore.privacy.memo`): one folder per environment, beside the converted
# models, for every home of every test run (every xdist worker and the `dpicl` subprocesses their tests start),
# as one user's scheduled runs share their home's. Each answer is keyed by its public inputs, the accountants'
# versions and a digest of the code that computes it, so a change to that code is computed afresh. A fresh
# environment (a fresh clone's `make test`) starts from the answers kept with the tests (`accounting_seed`) that
# this code asks for, and computes the rest once. An environment this user cannot write gets a folder for this
# test run only.
SHARED_ACCOUNTING_CACHE = "DPICL_TEST_ACCOUNTING_CACHE"
_MADE_ACCOUNTING_CACHE = []


def _share_accounting_cache() -> None:
    if not os.environ.get(SHARED_ACCOUNTING_CACHE):  # the first process of the run (the xdist controller)
        shared = _TEST_CACHE / "accounting"
        try:
            shared.mkdir(parents=True, exist_ok=True)
        except OSError:
            shared = Path(tempfile.mkdtemp(prefix="dpicl-test-accounting-"))
            _MADE_ACCOUNTING_CACHE.append(str(shared))
        accounting_seed.plant(shared)  # the answers kept with the tests, where this code asks for them
        os.environ[SHARED_ACCOUNTING_CACHE] = str(shared)
    (Path(_HOME) / "cache").mkdir(exist_ok=True)
    (Path(_HOME) / "cache" / "accounting").symlink_to(os.environ[SHARED_ACCOUNTING_CACHE], target_is_directory=True)


_share_accounting_cache()


def _leave_at_once() -> None:
    """An xdist worker's last exit step: its results are with the controller, its other exit handlers (Prefect's
    drains among them) have run, and Python's own teardown of the worker's modules (torch, Prefect, the models)
    took about 3 s that the controller waited for at the end of every run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _set_up_a_test_process() -> None:
    """What every process that runs tests needs (an xdist worker, or pytest in one process); the xdist
    controller runs none and skips it (`pytest_configure`)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import atexit

        atexit.register(_leave_at_once)  # registered before Prefect is imported: it runs after Prefect's
    _share_converted_models()
    mlflow_store.seed(Path(_HOME), _TEST_CACHE)
    # An xdist worker sends its flow runs, and those of the `dpicl` subprocesses its tests start, to the
    # controller's Prefect test server: no temporary server per process. It answers by the worker's first test
    # (`pytest_collection_finish`). Tests of the temporary server itself drop PREFECT_API_URL from their
    # subprocess's environment.
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(prefect_test_server.URL):
        os.environ["PREFECT_API_URL"] = os.environ[prefect_test_server.URL]
    # `prefect.main` configures logging at its first import, and that configuration closes the handlers there
    # before (logging.shutdown). absl's handler (absl comes with dp-accounting) closes its stream on close unless
    # the stream is the sys.stderr of that moment: inside a test using `capsys` it is not, and pytest's own
    # capture stream would be closed under it ("I/O operation on closed file", sys.stderr lost). So Prefect is
    # imported here, before any test module (and absl) is imported, and after PREFECT_API_URL is set: Prefect
    # reads its settings from the environment once, at import.
    import prefect.main  # noqa: F401
    import torch

    # Under pytest-xdist (`make test` runs a worker per core and one more: Makefile) a second torch thread per
    # worker only contends with the other workers; so does one in the processes its tests start (`dpicl`
    # commands, Dask workers, Prefect's flow-run subprocess), which read OMP_NUM_THREADS when torch loads.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    torch.set_num_threads(1 if worker else max(1, min(2, os.cpu_count() or 1)))
    if worker:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def dpicl_home() -> Path:
    return Path(_HOME)


@pytest.fixture(autouse=True)
def budgets_end_with_their_test():
    """The suite shares one home and its data: a budget a test sets on shared records would make every later
    test's dataset id a second name for them (`SameRecordsError`). Budgets a test sets are its own."""
    import sqlite3

    from dpcore.privacy.ledger import Ledger

    path = Ledger().path
    with sqlite3.connect(path) as conn:
        before = {row[0] for row in conn.execute("SELECT dataset_id FROM budgets")}
    yield
    with sqlite3.connect(path) as conn:
        added = {row[0] for row in conn.execute("SELECT dataset_id FROM budgets")} - before
        conn.executemany("DELETE FROM budgets WHERE dataset_id = ?", [(d,) for d in added])


@pytest.fixture(autouse=True)
def stop_requests_end_with_their_test():
    """A test that asks for a stop (`tasks.common.STOP_REQUESTED`) or adds a progress sink and fails before it
    undoes them would stop every later run in its worker: both end with the test that made them."""
    yield
    common = sys.modules.get("tasks.common")  # a test that never loaded the stages changed neither
    if common is not None:
        common.STOP_REQUESTED.clear()
        common._PROGRESS_SINKS.clear()


@pytest.fixture(scope="session")
def embedded_lm():
    """The real embedded SmolLM2-135M-Instruct (converted once per session)."""
    from dpcore.lm.model import LanguageModel

    return LanguageModel.load("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_lm():
    """A randomly initialised tiny Llama with the embedded model's tokenizer."""
    from dpcore.lm.model import LanguageModel

    return LanguageModel.tiny_random(seed=0)


@pytest.fixture(scope="session")
def peaked_lm():
    """The tiny random Llama with its weights scaled up: input-dependent next-token distributions as peaked as a
    trained model's (the plain tiny model's are nearly flat; greedy text varies with the input)."""
    import torch

    from dpcore.lm.model import LanguageModel

    lm = LanguageModel.tiny_random(seed=1)
    with torch.no_grad():
        for param in lm.model.parameters():
            if param.dim() == 2:
                param.mul_(20)
    return lm


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_lm, tmp_path_factory) -> Path:
    """The tiny model saved as a local model folder: what `--model PATH` loads in CLI tests."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def agnews_spec():
    from dpcore.data.taskspec import load_task_spec

    return load_task_spec("agnews")


@pytest.fixture(scope="session")
def made_up_records() -> dict[str, list[str]]:
    """Short made-up records per AG News label (public test data standing in for private ones)."""
    import numpy as np

    words = ["market", "match", "election", "chip", "storm", "merger", "league", "rocket"]
    rng = np.random.default_rng(0)
    return {label: [f"{label} item {i}: " + " ".join(rng.choice(words, size=4)) for i in range(60)]
            for label in ("World", "Sports", "Business", "Technology")}


@pytest.fixture(scope="session")
def agnews():
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    return load_dataset(load_task_spec("agnews"))


@pytest.fixture(scope="session")
def movies_genre():
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    return load_dataset(load_task_spec("movies-sample-genre"))


@pytest.fixture()
def one_thread():
    """One torch thread: tiny models gain nothing from two, and on a CPU shared with other test
    processes two spinning threads per process made the tiny-model tests 5-10x slower (measured)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def cli(capsys):
    """`dpicl ARGV` in this process: returns (exit code, stdout, stderr)."""
    from flows.cli import main

    def run(argv):
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture()
def fake_audit_result():
    """A factory of `AuditResult`s with Gaussian scores: 100 members shifted by `member_shift`, 400 non-members."""
    import numpy as np
    import pandas as pd

    from dpcore.audit.procedures import AuditResult
    from dpcore.audit.statistics import roc_auc

    def make(setting, member_shift, seed=0):
        rng = np.random.default_rng(seed)
        members, non_members = rng.normal(member_shift, 1, 100), rng.normal(0, 1, 400)
        scores = pd.DataFrame({
            "setting": setting, "epsilon": 1.0, "demo_set": 0, "trial": np.arange(500) % 10,
            "role": ["member"] * 100 + ["non_member"] * 400, "member": [True] * 100 + [False] * 400,
            "record_id": [f"r{i}" for i in range(500)], "attack": "duan",
            "score": np.concatenate([members, non_members]),
        })
        return AuditResult(
            setting=setting, epsilon=1.0, noise_multiplier=0.5, delta=1e-4, auc=roc_auc(members, non_members),
            auc_ci=(0.4, 0.6), trial_aucs=(0.5, 0.5), trials=2, demo_sets=1, members_per_trial=50,
            non_members_per_trial=200, tpr_at_1pct_fpr=0.0, tpr_at_01pct_fpr=0.0, pooled_auc=0.5,
            epsilon_lower_bound=0.0, confidence=0.95, max_overlap_tokens=2, overlapping_records=0,
            overlap_threshold=8, crosscheck_agreed=True, model="m", dataset="d", seconds=1.0,
            passed=False, reasons=("first reason", "second reason"), mia_scores=scores,
        )

    return make


@pytest.fixture()
def tickets_spec(tmp_path):
    """The task spec of the tickets user dataset (tests/tickets.py), loaded from a YAML file."""
    from tickets import SPEC_YAML

    from dpcore.data.taskspec import load_task_spec

    path = tmp_path / "tickets.yaml"
    path.write_text(SPEC_YAML)
    return load_task_spec(path)


# The files measured slowest (each file's tests' wall time in its worker, on the 2-core machine), slowest first.
# `make test` hands files to its workers in collection order (`--no-loadscope-reorder`; xdist would
# otherwise order them by their number of tests), so these start first and the workers finish together
# (longest-processing-time-first) instead of one of them running a long file alone at the end. The other
# files follow in their usual order.
# The neighbouring-dataset test's two halves come first, so that they start on two workers: each half's ledger
# history of its dataset ids must be what its own commands left (they share the ids `nb-<variant>` in one home).
SLOWEST_FIRST = (
    "test_neighbours_commands.py", "test_neighbours.py", "test_ledger_pipeline.py", "test_release_methods.py",
    "test_pipeline.py", "test_prefect_server.py", "test_icl.py", "test_compare.py", "test_audit.py",
    "test_cli_experience.py", "test_audit_stop.py", "test_reproduce_tables.py", "test_methods.py", "test_dpsgd.py",
    "test_dask_runner.py", "test_privacy_boundary.py", "test_release.py", "test_generation.py", "test_pate_released_cost.py",
    "test_adapters.py", "test_benchmarks_dpsgd.py", "test_endpoint.py", "test_composition.py", "test_datasets.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


_STOP_SHARED_SERVER = []


def pytest_configure(config):
    """The xdist controller runs no test: it starts the one Prefect test server every worker uses, first thing
    (the workers import, and collect, while it starts). Every other process sets itself up for tests."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "numprocesses", None):
        _STOP_SHARED_SERVER.append(prefect_test_server.start())
        return
    _set_up_a_test_process()


def pytest_collection_finish(session):
    """A worker waits for the shared server after collecting, before its first test."""
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(prefect_test_server.URL):
        prefect_test_server.wait_until_ready()


def pytest_unconfigure(config):
    import shutil

    while _STOP_SHARED_SERVER:
        _STOP_SHARED_SERVER.pop()()
    while _MADE_ACCOUNTING_CACHE:
        shutil.rmtree(_MADE_ACCOUNTING_CACHE.pop(), ignore_errors=True)
