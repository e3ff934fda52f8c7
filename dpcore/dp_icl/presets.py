"""DP-ICL's presets: the ensemble and the queries a run gets when nothing sets them, fixed from the paper and the
machine, never from the private data.

Both presets use the paper's ensemble for classification (Wu et al. 2024, the classification experiments; the authors' configs:
`ensemble: 10`, `shots: 4`): M = 10 disjoint subsets of k = 4 exemplars per query (so q = 40 / |D|), votes by
contextually calibrated label probabilities (the authors' code scores every prompt with its calibration inputs),
one query per draw (the paper's fresh subsample per query), and for extraction tasks at most K = 4 of the query's
words voted per subset (`dpcore.dp_icl.keywords`). They differ in the queries planned for:

- GPU_PRESET: Q = 10,000 queries, the scale the paper accounts its classification budget for;
- CPU_PRESET: Q = 50 queries: each query is M = 10 prompt prefixes and 40 scorings (the query and the three
  content-free inputs per prompt), seconds per query for the embedded 135M model on 2 CPU cores.

The noise is not a preset: the plan calibrates it to the run's epsilon for the queries planned
(`dpcore.dp_icl.privacy.dp_icl_plan`), and `queries_within` tells the user up front how many queries a budget
affords at a given noise.
"""

from __future__ import annotations

from typing import Any

from dpcore.dp_icl.keywords import DEFAULT_MAX_KEYWORDS

PRESETS = ("auto", "cpu", "gpu")

GPU_PRESET: dict[str, Any] = {"subsets": 10, "shots": 4, "queries": 10_000, "queries_per_draw": 1,
                              "vote_mode": "calibrated", "max_keywords": DEFAULT_MAX_KEYWORDS}
CPU_PRESET: dict[str, Any] = {"subsets": 10, "shots": 4, "queries": 50, "queries_per_draw": 1,
                              "vote_mode": "calibrated", "max_keywords": DEFAULT_MAX_KEYWORDS}


def preset(name: str, device_type: str = "cpu") -> tuple[str, dict[str, Any]]:
    """(the preset's name, its values): `gpu`, `cpu`, or `auto`: gpu when the model's device type is "cuda"
    (the caller's `torch.device(...).type`), cpu otherwise."""
    if name not in PRESETS:
        raise ValueError(f"preset: {name!r} is none of {', '.join(PRESETS)}")
    if name == "auto":
        name = "gpu" if device_type == "cuda" else "cpu"
    return name, dict(GPU_PRESET if name == "gpu" else CPU_PRESET)


__all__ = ["CPU_PRESET", "GPU_PRESET", "PRESETS", "preset"]
