"""DP few-shot generation's privacy plan (Tang et al. Algorithm 1, Theorem 1), decided once.

What each requested epsilon means for a run, and what the run charges:

- epsilon > 0 finite, row "tang": one sigma for the run, calibrated at the largest per-label
  sampling rate q = MN/|D_y| (the labels are disjoint, so they compose in parallel:
  `dpcore.fewshot.accounting.calibrate_for_labels`), T = max_tokens x demos_per_label token steps,
  at delta. Charged: T Poisson-sampled steps of the mechanism at (sigma, q).
- epsilon = inf, row "sigma-zero": sigma = 0, no noise; the same q and T. Charged as an
  infinite spend.
- epsilon = 0, row "instruction-only": demonstrations from the instruction alone; no private
  record is read and nothing is charged.

The non-private rows a run opts into are charged too, each an infinite spend (sigma = 0): the
`sigma-zero` baseline (the run's q and T), `random-real` (real private records as
demonstrations) and the audit's non-private reference (`audit-reference`), whose q = 1, T = 1
only name the event.

`fewshot_plan` is the one place this is decided: the pipeline's calibration stage, the dry run
before `dpicl run`, `dpicl generate`, `dpicl audit` and `dpicl evaluate --baseline random-real`
all build their `FewShotPlan` here, and charge its `privacy_plans()` through `tasks.charge`.
A `FewShotPlan` is a frozen pydantic model: the calibration stage's cached result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from dpcore.errors import ConfigError
from dpcore.fewshot import accounting
from dpcore.fewshot.config import GenerationConfig
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

TANG = "tang"  # the DP demonstrations' row: the method's name (tables before it say "dp")
SIGMA_ZERO = "sigma-zero"
INSTRUCTION_ONLY = "instruction-only"
RANDOM_REAL = "random-real"
AUDIT_REFERENCE = "audit-reference"
PIPELINE_PURPOSE = "pipeline"
BASELINE_PURPOSE = "baseline"

# The public `calibration` table's columns, one row per requested epsilon (`Calibration.row`).
CALIBRATION_COLUMNS = [
    "epsilon", "method", "mechanism", "noise_multiplier", "sampling_rate", "steps", "delta", "epsilon_upper",
    "epsilon_lower", "epsilon_estimate", "epsilon_crosscheck", "crosscheck_agreed", "num_subsets", "subset_size",
    "warnings",
]


class Calibration(BaseModel):
    """What one requested epsilon means: the row ("tang", "sigma-zero", "instruction-only"), sigma, q, T
    and delta, and the accountant's view of them (public aggregates).

    `epsilon` is the requested bound (the guarantee claimed), `epsilon_upper` the accountant's upper
    bound at sigma (at most `epsilon`), with its lower bound, estimate and the dp-accounting cross-check.
    `sampling_rate` is the largest q over the labels (0 for instruction-only: nothing is sampled)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    epsilon: float
    method: str
    mechanism: str
    noise_multiplier: float
    sampling_rate: float
    steps: int
    delta: float
    epsilon_upper: float
    epsilon_lower: float
    epsilon_estimate: float
    epsilon_crosscheck: float
    crosscheck_agreed: bool
    num_subsets: int
    subset_size: int
    warnings: tuple[str, ...] = ()
    limiting_label: str | None = None  # the label with the largest q (None: instruction-only)
    per_label_epsilon: dict[str, float] = Field(default_factory=dict)

    @property
    def reads_private_data(self) -> bool:
        return self.method != INSTRUCTION_ONLY

    def row(self) -> dict:
        """The `calibration` table's row (warnings joined by newlines)."""
        values = {name: getattr(self, name) for name in CALIBRATION_COLUMNS}
        values["warnings"] = "\n".join(self.warnings)
        return values


class FewShotPlan(BaseModel):
    """A DP few-shot run's privacy decision: one `Calibration` per requested epsilon, the non-private
    rows it opted into, and (`privacy_plans`) the spends charged for them."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    mechanism: str
    num_subsets: int
    subset_size: int
    sampling_rate: float   # the run's q: the largest over the labels
    steps: int             # T = max_tokens x demos_per_label
    delta: float
    calibrations: tuple[Calibration, ...]
    baselines: tuple[str, ...] = ()
    audit_reference: bool = False
    purpose: str | None = None   # None: the pipeline's ("pipeline" for tang rows, "baseline" for the others)
    repeats: int = 1             # spends per charged row (the audit's demo sets each generate anew)

    def calibration(self, epsilon: float) -> Calibration:
        for item in self.calibrations:
            if item.epsilon == float(epsilon):
                return item
        raise ConfigError(f"epsilon {epsilon}: not among the plan's epsilons "
                          f"({', '.join(f'{c.epsilon:g}' for c in self.calibrations)})")

    def tang(self) -> list[Calibration]:
        """The rows of DP demonstrations (finite epsilon > 0), by epsilon."""
        return [c for c in self.calibrations if c.method == TANG]

    def generations(self) -> list[tuple[str, float, float]]:
        """(row, epsilon, sigma) of every demo set the run generates: "tang" at each finite epsilon > 0,
        "sigma-zero" (epsilon inf) and "instruction-only" (epsilon 0) when asked as epsilons or baselines;
        sorted by (row, epsilon)."""
        rows = {(c.method, c.epsilon): c.noise_multiplier for c in self.calibrations}
        if SIGMA_ZERO in self.baselines:
            rows.setdefault((SIGMA_ZERO, math.inf), 0.0)
        if INSTRUCTION_ONLY in self.baselines:
            rows.setdefault((INSTRUCTION_ONLY, 0.0), 0.0)
        return [(method, eps, sigma) for (method, eps), sigma in sorted(rows.items(), key=_row_order)]

    def privacy_plans(self) -> list[PrivacyPlan]:
        """One `PrivacyPlan` per charged row (its `method` names the row): "tang" at each epsilon,
        "sigma-zero", and the opted-in "random-real" and "audit-reference"; instruction-only reads no
        private record and has none. Each holds `repeats` spends."""
        plans = []
        for method, eps, sigma in self.generations():
            if method == INSTRUCTION_ONLY:
                continue
            what = "Algorithm 1 token steps" if method == TANG else "Algorithm 1 token steps without noise"
            plans.append(self._plan(method, eps, sigma, self.sampling_rate, self.steps, what))
        for name in ((RANDOM_REAL,) if RANDOM_REAL in self.baselines else ()) + (
                (AUDIT_REFERENCE,) if self.audit_reference else ()):
            plans.append(real_records_plan(name, self.mechanism, self.delta, self.purpose or BASELINE_PURPOSE,
                                           self.repeats))
        return plans

    def _plan(self, method: str, epsilon: float, sigma: float, q: float, steps: int, what: str) -> PrivacyPlan:
        purpose = self.purpose or (PIPELINE_PURPOSE if method == TANG else BASELINE_PURPOSE)
        spend = Spend.sampled_steps(self.mechanism, float(sigma), float(q), int(steps), purpose, what)
        return PrivacyPlan(method=method, epsilon=epsilon, delta=self.delta, spends=(spend,) * self.repeats,
                           parameters={"noise_multiplier": float(sigma), "sampling_rate": float(q),
                                       "steps": int(steps), "mechanism": self.mechanism,
                                       "num_subsets": self.num_subsets, "subset_size": self.subset_size})


def _row_order(item) -> tuple:
    """DP demonstrations first, then the baselines by name, each by epsilon (generation and charge order)."""
    (method, eps), _ = item
    return (method != TANG, method, eps)


REAL_RECORDS_WHAT = {RANDOM_REAL: "real private records as demonstrations",
                     AUDIT_REFERENCE: "the audit's non-private reference: real records as 1-shot demonstrations"}


def real_records_plan(name: str, mechanism: str, delta: float, purpose: str = BASELINE_PURPOSE,
                      repeats: int = 1) -> PrivacyPlan:
    """Real private records placed in prompts with no noise (`random-real` demonstrations, the audit's
    non-private reference): an infinite spend (sigma = 0; q = 1, T = 1 only name the event)."""
    spend = Spend.sampled_steps(mechanism, 0.0, 1.0, 1, purpose, REAL_RECORDS_WHAT[name])
    return PrivacyPlan(method=name, epsilon=math.inf, delta=delta, spends=(spend,) * repeats,
                       parameters={"noise_multiplier": 0.0, "mechanism": mechanism})


def _instruction_only(generation: GenerationConfig, steps: int, delta: float) -> Calibration:
    zero = 0.0
    return Calibration(epsilon=0.0, method=INSTRUCTION_ONLY, mechanism=generation.mechanism, noise_multiplier=zero,
                       sampling_rate=zero, steps=steps, delta=delta, epsilon_upper=zero, epsilon_lower=zero,
                       epsilon_estimate=zero, epsilon_crosscheck=zero, crosscheck_agreed=True,
                       num_subsets=generation.num_subsets, subset_size=generation.subset_size)


def _calibrated(target: float, label_counts: Mapping[str, int], generation: GenerationConfig, steps: int,
                delta: float) -> Calibration:
    """sigma for a finite target (or sigma = 0 for inf) at the largest q, with every label's epsilon."""
    result = accounting.calibrate_for_labels(target, label_counts, generation.num_subsets, generation.subset_size,
                                             steps, delta, mechanism=generation.mechanism)
    report = result["report"]
    finite = math.isfinite(target)
    return Calibration(
        epsilon=float(target), method=TANG if finite else SIGMA_ZERO, mechanism=result["mechanism"],
        noise_multiplier=float(result["noise_multiplier"]), sampling_rate=float(result["sampling_rate"]),
        steps=int(result["steps"]), delta=float(result["delta"]),
        epsilon_upper=float(result["epsilon"]) if finite else math.inf,
        epsilon_lower=float(report.epsilon_lower), epsilon_estimate=float(report.epsilon_estimate),
        epsilon_crosscheck=float(report.epsilon_crosscheck), crosscheck_agreed=bool(result["crosscheck_agreed"]),
        num_subsets=generation.num_subsets, subset_size=generation.subset_size,
        warnings=tuple(result["warnings"]), limiting_label=str(result["limiting_label"]),
        per_label_epsilon={label: float(r.epsilon) for label, r in result["per_label"].items()},
    )


def run_sampling_rate(label_counts: Mapping[str, int], num_subsets: int, subset_size: int) -> float:
    """The run's q: the largest q = MN/|D_y| over the labels with private records."""
    rates = [accounting.sampling_rate(num_subsets, subset_size, count) for count in label_counts.values() if count]
    if not rates:
        raise ConfigError("label_counts holds no label with private records")
    return max(rates)


def fewshot_plan(epsilons: Sequence[float], label_counts: Mapping[str, int], generation: GenerationConfig,
                 delta: float, *, baselines: Sequence[str] = (), audit_reference: bool = False,
                 purpose: str | None = None, repeats: int = 1) -> FewShotPlan:
    """The privacy plan of DP few-shot generation for `epsilons` (Tang et al. Algorithm 1).

    `label_counts`: |D_y| per label of the private records the generation reads (public, as in the
    paper); `generation`: M, N, T_max, demos per label and the mechanism (T = T_max x demos per
    label); `delta`: the run's delta. `baselines`: the comparison rows asked for (sigma-zero and
    random-real are charged, instruction-only generated); `audit_reference`: the audit's non-private
    reference is charged. `purpose`: the ledger purpose of every spend (None: "pipeline" for DP rows,
    "baseline" for the non-private ones); `repeats`: how many times each charged row is generated
    (the audit's demo sets). Raises ConfigError for an unreachable target or q > 1."""
    if not epsilons:
        raise ConfigError("epsilons: at least one epsilon")
    if int(repeats) < 1:
        raise ConfigError(f"repeats: must be >= 1, got {repeats}")
    steps = accounting.total_steps(generation.max_tokens, generation.demos_per_label)
    targets = sorted({float(e) for e in epsilons})
    if any(math.isnan(eps) or eps < 0 for eps in targets):
        raise ConfigError(f"epsilons: each must be >= 0 or inf, got {', '.join(map(str, targets))}")
    # q only matters to a row that samples private records (instruction-only reads none)
    samples = any(eps > 0 for eps in targets) or SIGMA_ZERO in baselines
    q = run_sampling_rate(label_counts, generation.num_subsets, generation.subset_size) if samples else 0.0
    calibrations = []
    for eps in targets:
        calibrations.append(_instruction_only(generation, steps, delta) if eps == 0
                            else _calibrated(eps, label_counts, generation, steps, delta))
    return FewShotPlan(mechanism=generation.mechanism, num_subsets=generation.num_subsets,
                       subset_size=generation.subset_size, sampling_rate=q, steps=steps, delta=float(delta),
                       calibrations=tuple(calibrations), baselines=tuple(baselines),
                       audit_reference=bool(audit_reference), purpose=purpose, repeats=int(repeats))


def demos_epsilon(noise_multiplier: float, label_counts: Mapping[str, int], shots_by_label: Mapping[str, int],
                  num_subsets: int, subset_size: int, max_tokens: int, delta: float,
                  mechanism: str = "gaussian") -> float:
    """The run epsilon of demonstrations already generated at sigma: for each label, T = max_tokens x its
    demos, q = MN/|D_y|; the maximum over labels (parallel composition), as `fewshot_plan` accounts it.
    NaN when a label of the demos has no private record."""
    epsilons = []
    for label, shots in shots_by_label.items():
        count = int(label_counts.get(str(label), 0))
        if count < 1:
            return math.nan
        q = accounting.sampling_rate(num_subsets, subset_size, count)
        steps = accounting.total_steps(max_tokens, shots)
        epsilons.append(float(accounting.epsilon_for(noise_multiplier, q, steps, delta, mechanism).epsilon))
    return max(epsilons) if epsilons else math.nan


def default_delta(num_private_records: int) -> float:
    """delta = 1/|D_priv| (the paper's choice): `dpcore.fewshot.accounting.default_delta`."""
    return accounting.default_delta(num_private_records)
