"""Privacy numbers as a person reads them: the one rounding of every line printed or logged for people.

Epsilons keep 4 significant digits (`3.025`, `0.5`, `12.5`, `inf`), deltas 3 (`1e-05`, `8.4e-06`), noise
multipliers 4 (`0.3982`). Only text meant for a person goes through here: `--json`, Parquet tables,
MLflow params and metrics and the ledger's database keep full precision.
"""

from __future__ import annotations

import math

__all__ = ["fmt_delta", "fmt_eps", "fmt_sigma", "steps_text"]


def _number(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # "inf" as JSON spells it, or a value already formatted
        return value
    number = float(value)
    if math.isnan(number):
        return "?"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    text = format(number, spec)
    if "e" in text and 1 <= abs(number) < 1e16:  # 12345.6 reads as 12346, not 1.235e+04; 1e+300 stays short
        return f"{number:.0f}"
    return text


def fmt_eps(value) -> str:
    """An epsilon for a person: 4 significant digits (`3.025`), `inf`, `-` for none."""
    return _number(value, ".4g")


def fmt_delta(value) -> str:
    """A delta for a person: 3 significant digits (`1e-05`, `8.4e-06`), `-` for none."""
    return _number(value, ".3g")


def fmt_sigma(value) -> str:
    """A noise multiplier for a person: 4 significant digits (`0.3982`), `inf` for instruction-only."""
    return _number(value, ".4g")


def steps_text(steps: int, max_tokens: int) -> str:
    """What T counts, for a person: every mechanism step that reads a label's records, one per generated
    token of each of its demos (`T = 40 mechanism steps (20 tokens per demo x 2 demos per label)`). A demo
    that ends early takes fewer steps: T is what is accounted, the most a run can take."""
    demos = max(1, int(steps) // max(1, int(max_tokens)))
    return (f"T = {int(steps)} mechanism steps ({int(max_tokens)} tokens per demo x {demos} demo"
            f"{'s' if demos != 1 else ''} per label)")
