"""A privacy plan: what one private-prompting method will spend, decided once, before any charge.

Every method turns its privacy parameters into the same typed, frozen `PrivacyPlan`:

- DP few-shot generation (Tang et al., Algorithm 1; `dpcore.fewshot.plan`): one plan per charged
  row of the run, named by the row: "tang" at each epsilon (T Poisson-sampled token steps,
  Gaussian or report-noisy-max at sigma, rate q = MN/|D_y|), and the non-private rows opted into
  ("sigma-zero", "random-real", "audit-reference": infinite spends).
- PromptPATE (Duan et al. Section 4.2; Papernot et al. 2018 Confident-GNMax): the threshold test
  on every public query and GNMax on every query, each a Gaussian on the vote histogram (q = 1).
- PromptDPSGD (Duan et al. Section 4.1, App. C.1 Algorithm 1): T Poisson-sampled Gaussian steps
  (noise multiplier sigma, rate q).

A plan's `spends` (`dpcore.privacy.spend.Spend`: an event and its purpose) are exactly what the ledger
charges and stores (one entry each, `requests`), so the plan's composed epsilon and the ledger's
charge are the same call: `dpcore.privacy.composition.compose(plan.events(), delta)`. `parameters` holds
the method's public parameters (sigma, q, T, thresholds...), the values a `--json` output and
MLflow show. A plan with no spends reads no private record (epsilon
0: instruction-only generation, zero-shot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dpcore.errors import ConfigError
from dpcore.names import METHODS, PREDICTION_METHODS
from dpcore.privacy import composition
from dpcore.privacy.events import DpEvent, event_to_dict
from dpcore.privacy.spend import Spend

# What a plan may be named: a method, or one of DP few-shot generation's charged rows (`dpcore.fewshot.plan`).
FEWSHOT_ROWS: tuple[str, ...] = ("tang", "sigma-zero", "random-real", "audit-reference")
AUDIT_PLAN = "audit"  # the DP demo sets a regenerate-mode audit generates from its members (`tasks.audit`)
PLAN_NAMES: tuple[str, ...] = METHODS + PREDICTION_METHODS + FEWSHOT_ROWS[1:] + (AUDIT_PLAN,)


@dataclass(frozen=True)
class PrivacyPlan:
    """What one method at one target epsilon spends: the events charged, at one delta.

    `epsilon` is the target the user asked for (inf: a non-private run, 0: no private record
    read); the spends were calibrated so that their composition stays within it."""

    method: str
    epsilon: float
    delta: float
    spends: tuple[Spend, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in PLAN_NAMES:
            raise ConfigError(f"method must be one of {', '.join(PLAN_NAMES)}, got {self.method!r}")
        if math.isnan(self.epsilon) or self.epsilon < 0:
            raise ConfigError(f"epsilon must be >= 0 or inf, got {self.epsilon}")
        if not 0.0 < self.delta < 1.0:
            raise ConfigError(f"delta must be in (0, 1), got {self.delta}")
        object.__setattr__(self, "spends", tuple(self.spends))
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))

    @property
    def reads_private_data(self) -> bool:
        return bool(self.spends)

    def events(self) -> list[DpEvent]:
        """One event per spend, in order: what the ledger will hold for this plan."""
        return [spend.event for spend in self.spends]

    def composed(self):
        """This plan alone, composed at its delta (`dpcore.privacy.composition.compose`)."""
        return composition.compose(self.events(), self.delta)

    def requests(self, dataset_id: str, content_hash: str, run_id: str) -> list[Spend]:
        """The plan's spends as ledger charge requests for one dataset, data content and run, at its delta."""
        return [spend.bound(dataset_id, content_hash, run_id, self.delta) for spend in self.spends]

    def to_dict(self) -> dict[str, Any]:
        """Public: the method's parameters and spends (no private quantity is ever in a plan)."""
        return {"method": self.method, "epsilon": self.epsilon, "delta": self.delta,
                "parameters": dict(self.parameters),
                "spends": [{"what": s.what, "mechanism": s.mechanism, "noise_multiplier": s.noise_multiplier,
                            "sampling_rate": s.sampling_rate, "steps": s.steps, "purpose": s.purpose,
                            "event": event_to_dict(s.event)} for s in self.spends]}
