"""The ICL evaluation's parameters (`EvalConfig`): what `dpcore.lm.icl.evaluate` takes.

Shots per prompt, evaluation seeds (the demonstrations' choice and order), the test items, and contextual
calibration (Zhao et al. 2021, Section 5). A run's are its top-level fields of the same names
(`RunConfig.eval_config()`, `dpcore/config.py`, which sits above and derives the view).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EvalConfig(BaseModel):
    """Parameters of one ICL evaluation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shots: int = Field(4, ge=0, description="demonstrations in each ICL prompt")
    seeds: int = Field(5, ge=1, description="evaluation seeds (demo choice and order)")
    test_size: int | None = Field(None, ge=1, description="test items; default: the whole test split")
    calibrate: bool = True


__all__ = ["EvalConfig"]
