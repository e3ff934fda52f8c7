"""A run's model work estimated from public sizes, and its wall time at a measured rate.

Nothing here reads a record: a record's length is private (its tokens are a function of its text), so the
estimate takes every record, test item and audit candidate as `record_tokens` long (the public token cap when
the run sets one, else `TYPICAL_RECORD_TOKENS`) and counts the token positions each stage's forward passes
compute from the run's sizes alone (labels, demos, M, N, T_max, test items, seeds, the audit's design):

- DP few-shot generation (Tang et al. Algorithm 1): every token step runs, for each demo still generating,
  M group prompts of N records and the label line plus the text so far, and the public RVP prompt; records
  change every step, so nothing carries over between steps. T_max steps per demo (an upper bound: a demo may
  stop early).
- evaluation: every (demo set, seed) scores the test items once (the demos' prefix cached); zero-shot once.
- the audit: the (record, prompt) pairs its design scores times its forward passes per record; a
  regenerate-mode audit also generates its demo sets.
- PromptPATE: each teacher scores the public queries (and each candidate student the validation queries);
  PromptDPSGD: a forward and backward pass (about 3 forwards) per example of every step, then its evaluation.

Wall time = positions / `POSITIONS_PER_SECOND` (the embedded 135M model on 2 CPU threads, fitted to whole
`dpicl run` wall times on a shared 2-core machine: benchmarks/RESULTS.md, "The own-data loop"), scaled by
the threads and the model's size, plus `START_SECONDS` for the command's start (imports, the temporary
Prefect server, the model's load). An estimate for people, said before the run; the run's real time depends
on the records' lengths and the machine's load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

TYPICAL_RECORD_TOKENS = 40   # a sentence or two: what a record is taken to be when no public cap is set
LINE_TOKENS = 6              # a prefix or label line around each record ("Review: ... Sentiment: Positive")
POSITIONS_PER_SECOND = 350.0  # the embedded model, fp32, 2 CPU threads, a shared machine (fitted; see module doc)
REFERENCE_THREADS = 2
REFERENCE_PARAMETERS = 135e6
GPU_SPEEDUP = 20.0           # a GPU's rate over the reference CPU for a 135M model (launch-bound, not measured here)
START_SECONDS = 60.0         # `dpicl run`'s start: imports, the temporary Prefect server, the model's load


@dataclass(frozen=True)
class Work:
    """Token positions per stage (public: sizes only)."""

    generation: float = 0.0
    evaluation: float = 0.0
    audit: float = 0.0
    pate: float = 0.0
    dpsgd: float = 0.0

    @property
    def total(self) -> float:
        return self.generation + self.evaluation + self.audit + self.pate + self.dpsgd

    def __add__(self, other: Work) -> Work:
        return Work(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[float, ...]:
        return (self.generation, self.evaluation, self.audit, self.pate, self.dpsgd)


def generation_positions(labels: int, demos_per_label: int, num_subsets: int, subset_size: int, max_tokens: int,
                         record_tokens: int, private: bool = True) -> float:
    """Token positions of one generated row (an epsilon) over every label: per step and demo, M group prompts
    (N records, the label line, the text so far) and the public prompt; `private` False (instruction-only):
    the public prompt only."""
    steps = max_tokens
    grown = steps * (steps - 1) / 2  # the text so far, summed over the steps
    public = steps * LINE_TOKENS + grown
    groups = num_subsets * (steps * (subset_size * (record_tokens + LINE_TOKENS) + LINE_TOKENS) + grown) if private else 0
    return labels * demos_per_label * (groups + public)


def evaluation_positions(test_items: int, labels: int, runs: int, record_tokens: int) -> float:
    """`runs` scorings (demo set x seed) of the test items: each item's query and its labels' tokens."""
    return runs * test_items * (record_tokens + LINE_TOKENS + 2 * labels)


def audit_positions(scored_records: int, passes: int, record_tokens: int, epsilons: int = 1) -> float:
    """The audit's scoring: the first epsilon's pairs x passes per record; each further epsilon scores its
    candidates under its own prompts only (the references are reused)."""
    per_pass = scored_records * (record_tokens + LINE_TOKENS)
    return per_pass * (passes + max(0, epsilons - 1))


def pate_positions(teachers: int, queries: int, repeats: int, student_candidates: int, test_items: int,
                   labels: int, record_tokens: int) -> float:
    """PromptPATE: every teacher scores the public queries (once: repeats redraw the noise), each candidate
    student the queries again, and every repeat's student the test items."""
    per_item = record_tokens + LINE_TOKENS + 2 * labels
    return per_item * (teachers * queries + student_candidates * queries + repeats * test_items)


def dpsgd_positions(steps: int, batch_size: int, trainings: int, test_items: int, labels: int,
                    record_tokens: int) -> float:
    """PromptDPSGD: per training, steps x expected batch examples, forward and backward (about 3 forwards),
    then the test items."""
    per_item = record_tokens + LINE_TOKENS + 2 * labels
    return trainings * (3 * steps * batch_size * per_item + test_items * per_item)


def model_parameters(model: str) -> float:
    """The model's parameter count from its `config.json` when it is a local folder (no weights read); the
    embedded model's otherwise."""
    path = Path(model) / "config.json"
    try:
        cfg = json.loads(path.read_text())
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        vocab = int(cfg.get("vocab_size", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return REFERENCE_PARAMETERS
    return 12 * layers * hidden * hidden + vocab * hidden


def seconds(work: Work, device: str = "cpu", threads: int | None = None, parameters: float = REFERENCE_PARAMETERS
            ) -> float:
    """Wall seconds of `work` at the measured rate, scaled by threads (CPU) and the model's size, plus the start."""
    rate = POSITIONS_PER_SECOND * REFERENCE_PARAMETERS / max(parameters, 1.0)
    if device == "cuda":
        rate *= GPU_SPEEDUP
    elif threads:
        rate *= max(threads, 1) / REFERENCE_THREADS
    return START_SECONDS + work.total / rate


def minutes_text(total_seconds: float) -> str:
    """`about 7 minutes` (whole minutes; `under a minute`)."""
    minutes = math.ceil(total_seconds / 60)
    return "about 1 minute" if minutes <= 1 else f"about {minutes} minutes"
