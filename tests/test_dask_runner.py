"""The flow's generation tasks on a real `distributed` LocalCluster (a worker process of its own, prefect-dask)
give the same demonstrations as the thread runner for the same seeds."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import (
    prefect_harness,  # noqa: F401  (the shared harness fixture)
    share_tiny_model,
    tiny_config,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_dask_local_cluster_generates_the_same_demos_as_threads(tiny_lm):
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    from flows.pipeline import run_pipeline
    from flows.runner import make_task_runner

    share_tiny_model(tiny_lm)
    config = tiny_config(seed=2024, epsilons=[1.0], audit=False, baselines=[], seeds=1, test_size=4)
    threads = run_pipeline(config)
    with temporary_settings(updates={PREFECT_TASKS_REFRESH_CACHE: True}):  # recompute, do not reuse the cache
        # one worker process: each imports the model stack (about 9 s of CPU); the demos' sameness is the point
        dask = run_pipeline(config.model_copy(update={"task_runner": "dask:1"}))

    here = f"{os.uname().nodename}:{os.getpid()}"
    assert threads["generation_workers"] == [here]
    assert here not in dask["generation_workers"]
    assert len(dask["generation_workers"]) == 1  # the cluster's one worker process

    columns = ["method", "label", "epsilon", "shot", "text", "tokens", "stop_reason", "noise_multiplier"]
    first = pd.read_parquet(Path(threads["run_dir"]) / "demos.parquet").sort_values(["method", "epsilon", "label"])
    second = pd.read_parquet(Path(dask["run_dir"]) / "demos.parquet").sort_values(["method", "epsilon", "label"])
    assert len(first) == 4  # tang at one epsilon, four labels
    pd.testing.assert_frame_equal(first[columns].reset_index(drop=True), second[columns].reset_index(drop=True))
    assert dask["results"] == threads["results"]

    runner = make_task_runner("tcp://127.0.0.1:8786")
    assert runner.address == "tcp://127.0.0.1:8786"
