"""CLI: `dpicl ledger show | set-budget | charge` (the privacy budget ledger).

    dpicl ledger show [--dataset ID] [--delta D] [--json]
    dpicl ledger set-budget --dataset ID --epsilon E --delta D [--raise] [--json]
    dpicl ledger charge --dataset ID --run-id R --content-hash H --noise-multiplier S
                        --sampling-rate Q --steps T --delta D [--mechanism gaussian|rnm] [--purpose P]

`set-budget` raising a budget that entries already spend on (a larger epsilon or delta) needs `--raise`;
every change is printed with the budget before and after and kept in the ledger's budget history.
`charge` records a spend made outside dpicl (a notebook run of the same mechanism) so the
ledger stays complete; it is refused, exit code 3, when it would exceed the budget.
Every subcommand takes `--ledger PATH` (default `$DPICL_HOME/ledger.db`).
"""

from __future__ import annotations

import argparse

from dpcore.display import fmt_delta, fmt_eps
from dpcore.names import MECHANISMS, PURPOSES
from flows.cli.common import command, print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ledger", help="privacy budget ledger: composed spend and budget per dataset id",
        description="The privacy budget ledger: every generation that touched private data, composed per "
        "dataset id with the PRV accountant (cross-checked by dp-accounting PLD).")
    actions = parser.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")

    show = command(actions, "show", _show, help="entries and the composed epsilon, delta and budget")
    show.add_argument("--dataset", dest="dataset_id", help="one dataset id (default: every dataset id)")
    show.add_argument("--delta", type=float, default=None,
                      help="compose at this delta (default: the budget's delta, else the smallest entry delta)")
    _common(show)

    budget = command(actions, "set-budget", _set_budget, help="set, lower or raise a dataset's (epsilon, delta) budget")
    budget.add_argument("--dataset", dest="dataset_id", required=True, help="dataset id (default id: the dataset name)")
    budget.add_argument("--epsilon", type=float, required=True,
                        help="total epsilon the dataset may spend (at most 100, the largest a run is planned for)")
    budget.add_argument("--delta", type=float, required=True, help="the delta the total is measured at")
    budget.add_argument("--raise", dest="allow_raise", action="store_true",
                        help="raise a budget that has been spent on (a larger epsilon or delta); without it such a "
                             "raise is refused")
    _common(budget)

    charge = command(actions, "charge", _charge, help="record a spend made outside dpicl (refused beyond the budget)")
    charge.add_argument("--dataset", dest="dataset_id", required=True, help="dataset id to charge")
    charge.add_argument("--run-id", required=True, help="the run the spend belongs to")
    charge.add_argument("--content-hash", required=True, help="content hash of the private records used")
    charge.add_argument("--mechanism", choices=list(MECHANISMS), default="gaussian",
                        help="gaussian (Algorithm 1 line 12) or rnm (report-noisy-max, lines 15-19)")
    charge.add_argument("--noise-multiplier", type=float, required=True, help="sigma (0: no noise)")
    charge.add_argument("--sampling-rate", type=float, required=True, help="q = MN/|D_y|, largest over labels")
    charge.add_argument("--steps", type=int, required=True, help="T = max_tokens * demos_per_label")
    charge.add_argument("--delta", type=float, required=True, help="the delta the spend was calibrated for")
    charge.add_argument("--purpose", choices=list(PURPOSES), default="generate",
                        help="what spent it (default: generate)")
    _common(charge)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", dest="ledger_path", default=None,
                        help="ledger file (default: $DPICL_HOME/ledger.db)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _fmt(value) -> str:
    """An epsilon, sigma or q of the ledger view, rounded for people (`--json` keeps every digit)."""
    if isinstance(value, float) or value is None:
        return fmt_eps(value)
    return str(value)


def _summary(spend) -> str:
    line = f"dataset {spend.dataset_id}: epsilon {_fmt(spend.epsilon)} at delta {fmt_delta(spend.delta)}"
    if spend.budget is None:
        line += " (no budget set: charges are recorded, never refused)"
    else:
        line += (f" (budget epsilon {_fmt(spend.budget.epsilon)}, delta {fmt_delta(spend.budget.delta)};"
                 f" remaining {_fmt(spend.remaining)})")
    return line + f", {len(spend.entries)} entries"


def delta_note(spend) -> str | None:
    """Said whenever entries were calibrated at a delta other than the one the total is composed at."""
    others = sorted({e.delta for e in spend.entries if e.delta != spend.delta})
    if not others:
        return None
    return (f"note: the total is composed at delta {fmt_delta(spend.delta)}, but entries were calibrated at delta "
            f"{', '.join(fmt_delta(d) for d in others)}: each entry's epsilon_alone is at its own delta and does not "
            f"add up to the total (pass --delta D to compose at another delta)")


def _print_spend(spend) -> None:
    print(_summary(spend))
    note = delta_note(spend)
    if note:
        print(f"  {note}")
    if any(change.change != "first" for change in spend.budget_history):  # a budget set once says it above
        print("  budget history:")
        for change in spend.budget_history:
            print(f"    {change.set_at}  {change.describe()} ({change.entries} entries then)")
    if spend.entries:
        header = ("id", "created_at", "run_id", "purpose", "mechanism", "sigma", "q", "T", "delta",
                  "epsilon_alone(own delta)", "content_hash")
        rows = [header] + [
            (str(e.id), e.created_at, e.run_id, e.purpose, e.mechanism, _fmt(e.noise_multiplier),
             _fmt(e.sampling_rate), _fmt(e.steps), fmt_delta(e.delta), _fmt(e.epsilon_upper), e.content_hash[:12])
            for e in spend.entries
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for note in spend.warnings:
        print(f"  note: {note}")


def _show(args) -> int:
    # dp-accounting loads here, not for `dpicl --help`
    from tasks.charge import ledger_spends

    path, spends = ledger_spends(args.ledger_path, args.dataset_id, args.delta)
    if args.json:
        dicts = [{**s.to_dict(), "delta_note": delta_note(s)} for s in spends]
        print_json(dicts[0] if args.dataset_id else {"datasets": dicts})
        return 0
    if not spends:
        print(f"the ledger {path} has no entries and no budgets")
    for spend in spends:
        _print_spend(spend)
    return 0


def _set_budget(args) -> int:
    # dp-accounting loads here, not for `dpicl --help`
    from tasks.charge import set_budget

    change, spend = set_budget(args.ledger_path, args.dataset_id, args.epsilon, args.delta, args.allow_raise)
    if args.json:
        print_json({**spend.to_dict(), "budget_change": change.to_dict()})
        return 0
    budget = change.budget
    spent = f" after {change.entries} entries spent on it" if change.entries else ""
    print(f"budget of dataset {budget.dataset_id} {change.describe()}{spent} (kept in the ledger's budget history)")
    print(_summary(spend))
    if spend.epsilon > budget.epsilon:
        print("  note: the current spend already exceeds this budget: every further charge is refused")
    return 0


def _charge(args) -> int:
    # dp-accounting loads here, not for `dpicl --help`
    from tasks.charge import record_spend

    entry, spend = record_spend(args.ledger_path, {
        "dataset_id": args.dataset_id, "content_hash": args.content_hash, "run_id": args.run_id,
        "mechanism": args.mechanism, "noise_multiplier": args.noise_multiplier, "sampling_rate": args.sampling_rate,
        "steps": args.steps, "delta": args.delta, "purpose": args.purpose})
    if args.json:
        print_json({"entry": entry.to_dict(), **{k: v for k, v in spend.to_dict().items() if k != "entries"}})
        return 0
    print(f"charged entry {entry.id} (run {entry.run_id}): epsilon {_fmt(entry.epsilon_upper)} alone "
          f"at delta {fmt_delta(entry.delta)}")
    print(_summary(spend))
    return 0
