"""Running a script of benchmarks/ from a test: loaded from its file (benchmarks/ is no package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    """The module of benchmarks/<name>.py."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark(name: str, argv: list[str]) -> int:
    """`main(argv)` of benchmarks/<name>.py, with torch's thread count (its --threads sets it) restored."""
    threads = torch.get_num_threads()
    try:
        return load_benchmark(name).main(argv)
    finally:
        torch.set_num_threads(threads)
