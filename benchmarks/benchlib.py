"""What the model benchmarks share: their common flags and how a result is reported (a table, the JSON file
under $DPICL_HOME/benchmarks/ or --out, and with --json one JSON object as the last line)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DPICL = [sys.executable, "-m", "flows.cli"]


def dpicl_json(argv: list[str]) -> tuple[dict, float]:
    """One `dpicl` command with --json, run from the repository root: (its JSON, its wall seconds); a failure
    stops the benchmark naming the command and the end of what it printed."""
    began = time.monotonic()
    done = subprocess.run(DPICL + argv, cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"dpicl {' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), seconds


def model_parser(description: str, dataset: str) -> argparse.ArgumentParser:
    """--model, --dataset, --batch-size, --threads, --device, --out and --json; the benchmark adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m", help="a model name, or `tiny` (random tiny Llama)")
    parser.add_argument("--dataset", default=dataset)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="JSON result file")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    return parser


def report(result: dict, table: str, name: str, out: str | None, as_json: bool) -> int:
    """Print the table, write the result to `out` (default $DPICL_HOME/benchmarks/<name>.json), and with
    `as_json` print it as the last line."""
    from dpcore.data.artifacts import write_json_atomic
    from dpcore.home import subdir

    path = Path(out) if out else subdir("benchmarks") / f"{name}.json"
    write_json_atomic(path, result)
    print(table)
    print(f"written: {path}")
    if as_json:
        print(json.dumps(result, sort_keys=True, default=str))
    return 0


def load(args):
    """(task spec, dataset, language model) of the common flags, torch's threads set first."""
    import torch

    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec
    from dpcore.home import configure_environment
    from dpcore.lm.model import LanguageModel

    configure_environment()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = load_task_spec(args.dataset)
    lm = LanguageModel.tiny_random(seed=0, device=args.device) if args.model == "tiny" else \
        LanguageModel.load(args.model, device=args.device)
    return spec, load_dataset(spec), lm


class PeakMemory:
    """Peak memory growth of a phase (`peak_mb` after the block): the CUDA allocator's peak above the phase's
    start, or on the CPU the largest resident-set growth above it, sampled every 5 ms."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        import psutil
        import torch

        self.peak_mb = 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.process = psutil.Process()
        self.base = self.process.memory_info().rss
        self.stop = threading.Event()
        self.peak = self.base

        def sample():
            while not self.stop.is_set():
                self.peak = max(self.peak, self.process.memory_info().rss)
                self.stop.wait(0.005)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        else:
            self.stop.set()
            self.thread.join()
            self.peak_mb = (max(self.peak, self.process.memory_info().rss) - self.base) / 2**20
        return False
