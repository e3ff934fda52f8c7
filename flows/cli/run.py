"""CLI: `dpicl demo` (and later `dpicl run`, `dpicl ui`)."""

from __future__ import annotations

import time


def _demo(args) -> int:
    """Until the pipeline lands: load the embedded model and data and print a summary."""
    from dpcore.datasets import load_dataset
    from dpcore.home import dpicl_home
    from dpcore.lm import LanguageModel
    from dpcore.taskspec import load_task_spec

    began = time.perf_counter()
    lm = LanguageModel.load("smollm2-135m")
    print(f"model smollm2-135m: {lm.num_parameters(include_embeddings=True) / 1e6:.1f}M parameters, "
          f"vocabulary {lm.vocab_size}, loaded in {time.perf_counter() - began:.1f} s on {lm.device}")
    for name in ("agnews", "trec", "sst2", "movies-sample-genre"):
        data = load_dataset(load_task_spec(name))
        counts = ", ".join(f"{k}={v}" for k, v in data.label_counts().items())
        print(f"{name}: train {len(data.train)} / test {len(data.test)} ({counts})")
    print(f"results under {dpicl_home()}")
    return 0


def register(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="run the main pipeline on the embedded model and data")
    demo.set_defaults(handler=_demo)
