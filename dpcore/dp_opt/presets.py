"""DP-OPT's public hyperparameters, fixed from the paper (never tuned on private data).

Hong et al. 2024, Section 5 and the authors' sweep `sweeps/sst2/dp-opt.yml`: 205 demo subsets
(`--ensemble_num`) of 5 demonstrations (`--num_demos`), 40 candidate instructions (`--num_prompt`) of at most
50 new tokens (`--max_new_tokens`), sampling temperature 1.1 (`--gen_temp`), 1% of the training records held out
for choosing among the candidates (`--holdout_ratio`), target epsilon 8, and the first 10 tokens never end
(their `MinLengthLogitsProcessor(10)`). `PAPER` holds these; `SMOKE` is a size that runs in seconds on a CPU
with the tiny model (tests and demos).

Where we differ (kept as parameters, so the paper's values stay visible): the per-token budget is not fixed
(their `--dp_eps 1.8`) but calibrated so that J candidates of T tokens fit the target
(`dpcore.dp_opt.privacy.dp_opt_plan`); `selection_share` is the share of the target epsilon spent on choosing
the candidate (the paper spends its whole target there, relying on parallel composition over the disjoint
holdout, which our ledger does not express: its spends compose sequentially).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dpcore.errors import ConfigError

NOISES = ("gumbel", "exponential")


@dataclass(frozen=True)
class DpOptParams:
    """Public parameters of one DP-OPT run (`noise_multiplier` is set by the plan, `dp_opt_plan`)."""

    subsets: int = 205                 # M: disjoint demo subsets voting on each token
    shots: int = 5                     # k: demonstrations per subset's meta prompt (at most)
    max_tokens: int = 50               # T: new tokens per candidate instruction
    candidates: int = 40               # J: candidate instructions generated
    temperature: float = 1.1           # each subset samples its vote at this temperature (0: its argmax)
    min_tokens: int = 10               # no end-of-text vote before this many tokens (public rule)
    holdout_fraction: float = 0.01     # share of records (keyed hash) that scores the candidates (J > 1 only)
    selection_share: float = 0.1       # share of the target epsilon spent on the candidate choice (J > 1 only)
    max_record_tokens: int = 64        # public token cap on each demonstration in a meta prompt
    noise: str = "gumbel"              # token choice noise: Gumbel (the paper's) or exponential, scale 2 sigma
    noise_multiplier: float = 0.0      # sigma of a token step (pure 1/sigma-DP); 0: not yet planned
    selection_noise_multiplier: float = 0.0  # sigma of the candidate choice (pure 1/sigma-DP)

    def __post_init__(self) -> None:
        for name in ("subsets", "shots", "max_tokens", "candidates", "max_record_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"dp-opt {name} must be an integer >= 1, got {value!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ConfigError(f"dp-opt min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"dp-opt temperature must be >= 0, got {self.temperature}")
        for name in ("holdout_fraction", "selection_share"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"dp-opt {name} must be in (0, 1), got {getattr(self, name)}")
        for name in ("noise_multiplier", "selection_noise_multiplier"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"dp-opt {name} must be a finite number >= 0, got {value}")
        if self.noise not in NOISES:
            raise ConfigError(f"dp-opt noise must be one of {', '.join(NOISES)}, got {self.noise!r}")

    @property
    def steps(self) -> int:
        """Token steps charged: T tokens of each of the J candidates."""
        return self.max_tokens * self.candidates

    def with_noise(self, noise_multiplier: float, selection_noise_multiplier: float = 0.0) -> DpOptParams:
        return replace(self, noise_multiplier=float(noise_multiplier),
                       selection_noise_multiplier=float(selection_noise_multiplier))


PAPER = DpOptParams()
SMOKE = DpOptParams(subsets=8, shots=2, max_tokens=6, candidates=2, min_tokens=2, holdout_fraction=0.25,
                    max_record_tokens=24)
