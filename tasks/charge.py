"""The privacy-ledger hooks of the pipeline (`dpcore.ledger`, issue 8).

- `charge_run`: before any generation task reads a private record, the flow charges every
  generation of the run that touches private data (one entry per DP epsilon, and one for
  the sigma = 0 baseline: an infinite spend) in ONE all-or-nothing `charge_many`. A run
  that would exceed the dataset's budget is refused (`BudgetExceededError`, exit 3) and
  nothing is generated. A retry of the same run (same run id) is not charged twice: it
  reuses the noise it already drew (the generation cache is scoped to the run).
- `audit_charge_hook`: the `charge(demo_set)` callback `dpcore.audit.dp_audit` calls before
  each of its DP generations from the audit's members (purpose "audit").
Instruction-only generation reads no private record and is never charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def _ledger_module():
    try:
        from dpcore import ledger
    except ImportError:  # the ledger issue has not landed: nothing to charge
        return None
    return ledger


def charge_run(config, data_hash: str, run_id: str, plan: list[dict], calibration: list[dict]) -> dict | None:
    """Charge the run's private-data generations (from the generation plan); returns a public summary."""
    ledger = _ledger_module()
    if ledger is None:
        return None
    book = ledger.Ledger()
    if any(entry.purpose == "pipeline" for entry in book.entries_for_run(run_id)):
        return {"dataset_id": config.ledger_id, "charged": 0, "note": "already charged (a retry of this run)"}
    row = next(r for r in calibration if r.get("sampling_rate"))
    q, steps, delta = float(row["sampling_rate"]), int(row["steps"]), float(row["delta"])
    spends = sorted({(item["method"], float(item["epsilon"]), float(item["noise_multiplier"]))
                     for item in plan if item["method"] != "instruction-only"})
    requests = [
        ledger.ChargeRequest(dataset_id=config.ledger_id, content_hash=data_hash, run_id=run_id,
                             mechanism=config.mechanism, noise_multiplier=sigma, sampling_rate=q, steps=steps,
                             delta=delta, purpose="pipeline")
        for _, _, sigma in spends
    ]
    entries = book.charge_many(requests)
    spend = book.spend(config.ledger_id)
    return {"dataset_id": config.ledger_id, "charged": len(entries),
            "entries": [{"method": m, "epsilon": "inf" if math.isinf(e) else e, "noise_multiplier": s}
                        for m, e, s in spends],
            "total_epsilon": "inf" if math.isinf(spend.epsilon) else spend.epsilon, "delta": spend.delta,
            "budget": spend.budget.to_dict() if spend.budget else None}


def audit_charge_hook(dataset_id: str | None, data_hash: str, run_id: str | None, noise_multiplier: float,
                      sampling_rate: float, steps: int, delta: float, mechanism: str
                      ) -> Callable[[int], None] | None:
    """The `charge(demo_set)` callback of `dp_audit` (None when there is no ledger or no run id)."""
    ledger = _ledger_module()
    if ledger is None or dataset_id is None or run_id is None:
        return None
    book = ledger.Ledger()

    def charge(demo_set: int) -> None:
        book.charge(dataset_id=dataset_id, content_hash=data_hash, run_id=run_id, mechanism=mechanism,
                    noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps, delta=delta,
                    purpose="audit")

    return charge
