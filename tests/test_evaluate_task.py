"""The pipeline's evaluate task (`tasks.evaluate`) on the tiny model: the random-real baseline of an
extraction task keeps the real records' ids in their own private table and blanks the generated answers
(a model prompted with real records may copy their words), through the same split `dpicl evaluate` uses."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import prefect_harness, share_tiny_model, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_random_real_extraction_answers_are_blanked_in_the_pipeline(tiny_lm):
    from flows.pipeline import run_pipeline

    share_tiny_model(tiny_lm)
    config = tiny_config(dataset="movies-sample-genre", data_path=None, task_spec=None, epsilons=[0.0],
                         baselines=["zero-shot", "random-real"], audit=False, audit_reference=False, seeds=1,
                         test_size=3, shots=2, dataset_id="extraction-random-real")
    summary = run_pipeline(config, run_id="extraction-random-real")
    private = Path(summary["private_run_dir"])
    predictions = pd.read_parquet(private / "predictions.parquet")
    real = predictions[predictions["method"] == "random-real"]
    assert len(real) == 3
    assert (real["pred_raw"] == "").all() and (real["pred_calibrated"] == "").all()
    assert all(len(ids) == 0 for ids in real["demo_ids"])
    zero = predictions[predictions["method"] == "zero-shot"]
    assert len(zero) == 3  # nothing else is blanked
    ids = pd.read_parquet(private / "real_demos.parquet")
    assert len(ids) == 1 and len(ids.loc[0, "demo_ids"]) == 2
