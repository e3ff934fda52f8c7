"""One privacy spend: a privacy event with what it pays for, from the plan to the ledger row.

A `Spend` is the one record of a use of private data at every stage:

- planned: `event` (a `dpcore.privacy.events` event, dp-accounting's shape) and `purpose` (the ledger
  purpose it is charged under), with `what` it pays for, for people. A plan's spends
  (`dpcore.privacy.plan.PrivacyPlan.spends`) are these.
- requested: the same spend bound to a dataset id, the content hash of its records, a run id and
  the delta it was calibrated for (`bound`, `PrivacyPlan.requests`): what `dpcore.privacy.ledger` charges.
- recorded: the same spend as a ledger row reads back, with its row `id`, `epsilon_upper` (this
  spend alone at its own delta), `status` and `created_at` (`dpcore.privacy.ledger.Ledger.entries`).

The event is the spend: it is what the ledger stores and composes, and what matching compares. Most
spends are T Poisson-sampled steps of one mechanism at noise multiplier sigma, rate q
(`Spend.sampled_steps`, `dpcore.privacy.events.sampled_steps_event`); for those, `mechanism`,
`noise_multiplier`, `sampling_rate` and `steps` read the event back (the ledger's display columns);
for any other event they are its kind and None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpcore.privacy.composition import NONPRIVATE, step_groups

if TYPE_CHECKING:
    from dp_accounting.dp_event import DpEvent

# `dpcore.privacy.events` is imported where a spend is made or read: it loads dp-accounting (absl, scipy), which a
# module that only names this type (`dpcore.privacy.ledger` for `dpicl ledger --help`) need not.


@dataclass(frozen=True)
class Spend:
    """One privacy spend: planned, requested (bound to data and a run) or recorded (a ledger row)."""

    event: DpEvent            # what it costs (`dpcore.privacy.events`); the ledger stores and composes this
    purpose: str              # the ledger purpose it is charged under (`dpcore.privacy.ledger.PURPOSES`)
    what: str = field(default="", compare=False)  # what it pays for, for people ("GNMax votes")
    # bound to a dataset, its records and a run (`bound`): a charge request
    dataset_id: str = ""
    content_hash: str = ""
    run_id: str = ""
    delta: float | None = None   # the delta the spend was calibrated for
    # recorded in the ledger
    id: int | None = None
    epsilon_upper: float | None = None  # this spend alone at its own delta (informational; totals compose)
    status: str | None = None
    created_at: str | None = None

    def __post_init__(self) -> None:
        # One canonical form (the stored one): an event read back from the ledger equals the one charged.
        from dpcore.privacy import events

        object.__setattr__(self, "event", events.event_from_dict(events.event_to_dict(self.event)))

    @classmethod
    def sampled_steps(cls, mechanism: str, noise_multiplier: float, sampling_rate: float, steps: int,
                      purpose: str, what: str = "", **bound: Any) -> Spend:
        """T steps of `mechanism` at noise multiplier sigma, each on a Poisson sample of rate q of the
        records (q = 1: all of them); sigma = 0 is no noise, an infinite spend. `bound`: the dataset,
        content hash, run id and delta of a request."""
        from dpcore.privacy.events import sampled_steps_event

        return cls(sampled_steps_event(mechanism, noise_multiplier, sampling_rate, steps), purpose, what,
                   **bound)

    def bound(self, dataset_id: str, content_hash: str, run_id: str, delta: float) -> Spend:
        """This spend as a charge request: for these records of `dataset_id`, in `run_id`, at `delta`."""
        return dataclasses.replace(self, dataset_id=dataset_id, content_hash=content_hash, run_id=run_id,
                                   delta=float(delta))

    # -- the display columns, read from the event

    @property
    def mechanism(self) -> str:
        """The step's mechanism ("gaussian", "rnm", "laplace"), else the event's kind ("composed", ...)."""
        from dpcore.privacy.events import event_kind

        return event_kind(self.event)

    @property
    def noise_multiplier(self) -> float | None:
        return self._parameter(1)

    @property
    def sampling_rate(self) -> float | None:
        return self._parameter(2)

    @property
    def steps(self) -> int | None:
        return self._parameter(3)

    def _parameter(self, index: int):
        from dpcore.privacy.events import steps_parameters

        parameters = steps_parameters(self.event)
        return None if parameters is None else parameters[index]

    @property
    def non_private(self) -> bool:
        """No noise somewhere in the event: an infinite spend."""
        return any(kind == NONPRIVATE for kind, *_ in step_groups([self.event]))

    def describe(self) -> str:
        """The spend's parameters for a message: "gaussian sigma=0.9 q=0.02 T=40" (public quantities)."""
        if self.noise_multiplier is None:
            return f"{self.mechanism} event"
        return f"{self.mechanism} sigma={self.noise_multiplier:.4g} q={self.sampling_rate:.4g} T={self.steps}"

    def to_dict(self) -> dict[str, Any]:
        """A ledger row for `--json`: the display columns next to the event itself."""
        from dpcore.privacy.events import event_to_dict

        return {"id": self.id, "dataset_id": self.dataset_id, "content_hash": self.content_hash,
                "run_id": self.run_id, "mechanism": self.mechanism, "noise_multiplier": self.noise_multiplier,
                "sampling_rate": self.sampling_rate, "steps": self.steps, "delta": self.delta,
                "epsilon_upper": self.epsilon_upper, "purpose": self.purpose, "status": self.status,
                "created_at": self.created_at, "event": event_to_dict(self.event)}


__all__ = ["Spend"]
