"""PromptPATE's presets: the flock, public queries and noise a run gets when the flags leave them unset.

GPU_PRESET is Duan et al. Table 7 (GPT3 rows): E = 200 one-shot teachers, Q = 500 public queries, T =
round(0.9 E) = 180, sigma2 = 20, sigma1 from the task YAML (1; 5 for AG News); 50 candidate students.

CPU_PRESET is sized for the embedded 135M model on 2 CPU cores: the flock scores E x Q (teacher, query)
pairs at about 2.5 a second on a shared 2-core CPU (benchmarks/RESULTS.md, PromptPATE), so E = 20 teachers
and at most Q = 50 queries per repeat keep the flock within minutes. The noise is set by the privacy
arithmetic, not by data: a vote count's sensitivity does not depend on E, so Table 7's sigma1 = 1 costs
the same per query on 20 teachers as on 200, and at epsilon 8 (delta 1.5e-5, the data-independent bound
of `dpcore.pate.privacy`) affords 2 queries in all, no student. sigma1 = sigma2 = 10 afford about 95 (31
per repeat over 3 repeats) and still leave a unanimous 20-teacher vote a 58% chance of passing T = 18
and a 10-vote margin a 76% chance of its label. 10 candidate students: each scores every labelled query.
"""

from __future__ import annotations

from typing import Any

PRESETS = ("auto", "cpu", "gpu")

GPU_PRESET: dict[str, Any] = {"teachers": 200, "queries": 500, "sigma1": None, "sigma2": 20.0,
                              "student_candidates": 50}
CPU_PRESET: dict[str, Any] = {"teachers": 20, "queries": 50, "sigma1": 10.0, "sigma2": 10.0,
                              "student_candidates": 10}


def preset(name: str, device: str = "auto") -> tuple[str, dict[str, Any]]:
    """(the preset's name, its values): `gpu` (Table 7), `cpu`, or `auto`: gpu on CUDA, cpu otherwise.
    A value of None leaves the field to the task YAML (sigma1)."""
    if name not in PRESETS:
        raise ValueError(f"preset: {name!r} is none of {', '.join(PRESETS)}")
    if name == "auto":
        from dpcore.lm.model import pick_device  # torch: only when the device decides

        name = "gpu" if pick_device(device).type == "cuda" else "cpu"
    return name, dict(GPU_PRESET if name == "gpu" else CPU_PRESET)


__all__ = ["CPU_PRESET", "GPU_PRESET", "PRESETS", "preset"]
