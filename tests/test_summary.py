"""Run summary tables (dpcore.report.summary): the results table, the audit verdict, the markdown, JSON rows."""

from __future__ import annotations

import math

import pandas as pd

from dpcore.report.summary import audit_verdict, epsilon_text, jsonable_rows, results_table, summary_markdown


def _metrics():
    rows = []
    for method, eps, accs in (("tang", 1.0, (0.6, 0.8)), ("zero-shot", 0.0, (0.5, 0.5)),
                              ("sigma-zero", math.inf, (0.9, 0.7))):
        for seed, acc in enumerate(accs):
            rows.append({"method": method, "epsilon": eps, "seed": seed, "n": 10, "accuracy": acc,
                         "calibrated_accuracy": acc, "calibrated": True, "shots": 4, "seconds": 1.0,
                         "reused": False})
    return pd.DataFrame(rows)


CALIBRATION = pd.DataFrame([{"epsilon": 1.0, "method": "tang", "noise_multiplier": 1.5, "sampling_rate": 0.01,
                             "steps": 20, "delta": 1e-4, "epsilon_upper": 0.99, "crosscheck_agreed": True}])
AUDIT = pd.DataFrame([{"setting": "dp", "epsilon": 1.0, "auc": 0.51, "tpr_at_1pct_fpr": 0.02,
                       "epsilon_lower_bound": 0.0, "max_overlap_tokens": 3, "passed": False,
                       "reasons": "first\nsecond"}])


def test_results_table_rows_sigma_and_audit():
    table = results_table(_metrics(), CALIBRATION, AUDIT)
    assert table["method"].tolist() == ["zero-shot", "tang", "sigma-zero"]  # the paper's row order
    dp = table.set_index("method").loc["tang"]
    assert dp["noise_multiplier"] == 1.5 and dp["accuracy_mean"] == 0.7
    # std over seeds, ddof = 0; the audit's verdict, never its AUC (a statistic of private records)
    assert abs(dp["accuracy_std"] - 0.1) < 1e-12 and dp["audit"] == "failed" and "mia_auc" not in table.columns
    assert table.set_index("method").loc["sigma-zero", "noise_multiplier"] == 0.0
    assert table.set_index("method").loc["zero-shot"].get("audit") is None or \
        pd.isna(table.set_index("method").loc["zero-shot"].get("audit"))


def test_audit_verdict_and_markdown():
    assert audit_verdict(None) == {"ran": False, "passed": None, "reasons": []}
    verdict = audit_verdict(AUDIT)
    assert verdict == {"ran": True, "passed": False, "reasons": ["epsilon 1: first", "epsilon 1: second"]}
    info = {"run_id": "r1", "dataset": "agnews", "data_hash": "0" * 64, "num_private_records": 100,
            "model": "tiny", "code_version": "abc", "seeded_noise": False, "run_dir": "/tmp/r1"}
    text = summary_markdown(info, results_table(_metrics(), CALIBRATION, AUDIT), CALIBRATION, verdict)
    assert "| 1 | tang | 1.5000 | 0.01 | 20 | 0.0001 | 0.990 | agreed |" in text
    assert "**FAILED**" in text and "- epsilon 1: second" in text
    assert "| sigma-zero | inf | 0.800 +/- 0.100" in text


def test_jsonable_rows_and_epsilon_text():
    rows = jsonable_rows(pd.DataFrame({"a": [math.nan, math.inf, 1 / 3], "b": ["x", "y", "z"]}))
    assert rows == [{"a": None, "b": "x"}, {"a": "inf", "b": "y"}, {"a": 0.333333, "b": "z"}]
    assert epsilon_text(math.inf) == "inf" and epsilon_text(2.0) == "2" and epsilon_text(0.5) == "0.5"
