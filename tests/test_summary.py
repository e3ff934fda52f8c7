"""Run summary tables (dpcore.report.summary): the results table, the audit verdict, the markdown, JSON rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dpcore.report.summary import (
    audit_verdict,
    epsilon_text,
    jsonable_rows,
    private_data_verdict,
    results_table,
    summary_markdown,
    verdict_line,
)


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


def _row(method, epsilon, raw, calibrated, n=300):
    return {"method": method, "epsilon": epsilon, "accuracy_mean": raw, "calibrated_accuracy_mean": calibrated,
            "n": n}


def test_the_private_data_verdict_uses_each_prompt_as_it_is_used_against_calibrated_zero_shot():
    rows = [_row("zero-shot", 0.0, 0.90, 0.543), _row("random-real", "inf", 0.99, 0.99),
            _row("tang", 8.0, 0.95, 0.60), _row("dpsgd", 8.0, 0.813, 0.99), _row("pate", 1.0, 0.2, 0.50),
            _row("dp", 4.0, 0.1, 0.30), _row("dpsgd", "inf", 0.99, 0.99)]
    verdict = private_data_verdict(rows)
    by_eps = {v["epsilon"]: v for v in verdict["epsilons"]}
    assert set(by_eps) == {1.0, 4.0, 8.0}  # references and epsilon inf (no privacy) are never the verdict
    # dpsgd is scored raw (0.813, not its calibrated 0.99); tang calibrated (0.60, not its raw 0.95)
    assert (by_eps[8.0]["method"], by_eps[8.0]["scoring"], by_eps[8.0]["accuracy"]) == ("dpsgd", "raw", 0.813)
    se = math.sqrt(0.813 * 0.187 / 300 + 0.543 * 0.457 / 300)
    assert by_eps[8.0]["standard_error"] == pytest.approx(se) and by_eps[8.0]["verdict"] == "paid"
    assert by_eps[1.0]["verdict"] == "within noise"  # 0.50 vs 0.543: -0.043, under two standard errors
    assert (by_eps[4.0]["method"], by_eps[4.0]["verdict"]) == ("tang", "hurt")  # an old `dp` row is tang
    lines = verdict_line(verdict).splitlines()
    assert lines[-1].startswith("private data paid at epsilon 8: dpsgd 0.813 (raw) against calibrated zero-shot 0.543")
    assert private_data_verdict([_row("dpsgd", 8.0, 0.8, 0.8)]) is None  # no zero-shot row: no verdict
    # a run asked at 1 and 8: PromptPATE charged 0.7 counts for 1, tang's 4 (and dp) for 8
    asked = private_data_verdict(rows + [_row("pate", 0.7, 0.1, 0.95)], epsilons=[1.0, 8.0])
    assert [(v["epsilon"], v["method"]) for v in asked["epsilons"]] == [(1.0, "pate"), (8.0, "dpsgd")]
    assert verdict_line(None) is None
