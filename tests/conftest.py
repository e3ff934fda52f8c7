"""Test session setup: a temporary $DPICL_HOME (nothing is written under ~ or ./.dpicl),
offline-safe Prefect/MLflow settings, and shared model/data fixtures.

The embedded model is converted once per test session into the temporary home.
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

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from dpcore.home import configure_environment  # noqa: E402

configure_environment()
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def dpicl_home() -> Path:
    return Path(_HOME)


@pytest.fixture(scope="session")
def embedded_lm():
    """The real embedded SmolLM2-135M-Instruct (converted once per session)."""
    from dpcore.lm import LanguageModel

    return LanguageModel.load("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_lm():
    """A randomly initialised tiny Llama with the embedded model's tokenizer."""
    from dpcore.lm import LanguageModel

    return LanguageModel.tiny_random(seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_lm, tmp_path_factory) -> Path:
    """The tiny model saved as a local model folder: what `--model PATH` loads in CLI tests."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def agnews():
    from dpcore.datasets import load_dataset
    from dpcore.taskspec import load_task_spec

    return load_dataset(load_task_spec("agnews"))


@pytest.fixture(scope="session")
def movies_genre():
    from dpcore.datasets import load_dataset
    from dpcore.taskspec import load_task_spec

    return load_dataset(load_task_spec("movies-sample-genre"))
