"""The privacy-ledger hooks: the one place plans are charged (`dpcore.privacy.ledger`).

Every spend reaches the ledger through its one charging method, `Ledger.charge` (see
`dpcore.privacy.ledger` for its flags); this module is the tasks layer's way to it.

- `charge_spends`: the one charging path of planned spends. Charges, in ONE all-or-nothing
  transaction, each spend the ledger does not already hold for this run id (`Ledger.charge` with
  `replay_recorded`: matched on the spend's parameters and the data's content hash, never on the
  run id alone). A retry that replays exactly the recorded spends is free; anything new is
  charged, or the run refused (`BudgetExceededError`, exit 3) before any generation.
  `dry_run=True` checks the budget without recording (the CLI's refusal before any model loads).
  `fresh=True` charges every spend anew (`replay_recorded=False`: a command that always draws
  fresh noise: `dpicl generate`, `dpicl audit`, `dpicl evaluate --baseline random-real`; never a
  replay). `charge_plans` is `charge_spends(plan_spends(...))`, for callers that hold plans.
- The plans: DP few-shot generation's come from its `FewShotPlan` (`dpcore.fewshot.plan`: one
  per DP epsilon, purpose "pipeline", and, only when the user opted into them, the non-private
  baselines as sigma = 0 spends, purpose "baseline": `sigma-zero`, `random-real` and the audit's
  non-private reference `audit-reference`); every method's from its registered planner
  (`tasks.methods.MethodEntry.plan`), held in the run's plan (`tasks.run_plans.RunPlan.method_plans`).
- `preflight` / `checks_after_ingest`: the checks that could fail after the charge, run before
  it (the model resolves and its context holds `max_tokens`; the task runner spec parses; the
  test size and the longest group prompt fit).
- `noise_charged`: which generation tasks may draw noise: those whose spend was charged by
  this attempt. A replayed spend may only be served from the cached draw; an unseeded
  generation whose cached draw is gone is refused by the generate task (never redrawn under
  the old charge).
- `ledger_report`: the dataset's composed spend after the run (audit entries included) for
  the run summary.
- `plan_spends` / `planned_cost`: the ledger requests of plans, and their composed cost (the plans of
  every method a run names are assembled in `tasks.run_plans`).
- `audit_charge_hook`: the `charge(demo_set)` callback `dpcore.audit.procedures.dp_audit` calls before
  each of its DP generations from the audit's members (the audit's plan, purpose "audit"; each demo set
  charged anew through `Ledger.charge`).
- `ledger_spends` / `set_budget` / `record_spend`: what `dpicl ledger` shows and changes (the
  composed spend per dataset id, a budget, a spend made outside dpicl, charged anew through
  `Ledger.charge`); `epsilon_report` /
  `sigma_report`: the accountant's answer for one spend or one target epsilon (`dpicl epsilon`,
  `dpicl calibrate`).

Instruction-only generation reads no private record and is never charged. There is no
fail-open path: a run without the ledger is an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpcore.errors import ConfigError
from dpcore.fewshot.plan import AUDIT_REFERENCE, RANDOM_REAL, SIGMA_ZERO, real_records_plan
from dpcore.flags import flag
from dpcore.privacy import ledger
from dpcore.public_outputs import Kind, declare

__all__ = ["AUDIT_REFERENCE", "RANDOM_REAL", "SIGMA_ZERO", "audit_charge_hook", "charge_plans", "charge_spends",
           "budget_delta", "epsilon_report", "ledger_spends", "noise_charged", "plan_spends", "planned_cost", "preflight",
           "real_records_spend", "record_spend", "set_budget", "sigma_report"]
PURPOSES = ledger.PURPOSES  # what may spend privacy (the ledger's `purpose` column)
NON_PRIVATE_BASELINES = (SIGMA_ZERO, RANDOM_REAL)
TINY_CONTEXT_LENGTH = 2048  # LanguageModel.tiny_random's max_position_embeddings

# A ledger charge or report (`charge_plans`, `ledger_report`, a plan's spends), wherever a command's --json embeds
# one, and the ledger's own rows. A spend's sigma, q and steps follow from the public counts (|D_y| sets q); an
# entry's and a total's epsilon follow from its event, compared in full, which for PromptPATE's data-dependent
# labelling is the DP-released bound (a DP output); an entry's number and the records' keyed content hash are
# identities (they say only whether two runs read the same records).
LEDGER_OUTPUTS = ("json:run", "json:generate", "json:pate", "json:tune", "json:audit", "json:release", "json:ledger",
                  "file:*generation.json")
for _output in LEDGER_OUTPUTS:
    declare(_output, Kind.IDENTITY, "**/ledger_entries/*/id", "**/ledger_entries/*/content_hash",
            "**/ledger_entry/id", "**/ledger_entry/content_hash")
    declare(_output, Kind.COUNT, *(f"**/{where}/*/{field}" for where in ("entries", "ledger_entries", "spends")
                                   for field in ("noise_multiplier", "sampling_rate", "steps")),
            "**/event/**/noise_multiplier", "**/event/**/sampling_probability", "**/event/**/count",
            "**/entries/*/epsilon", "**/planned_cost/epsilon", "**/planned_cost/methods/*")
    declare(_output, Kind.DP, "**/ledger_entries/*/epsilon_upper", "**/ledger_entry/epsilon_upper",
            "**/event/**/epsilon", "**/ledger/total_epsilon", "**/ledger_after/epsilon", "**/ledger/epsilon")
declare("sqlite:entries", Kind.IDENTITY, "/id", "/content_hash")
declare("sqlite:entries", Kind.COUNT, "/event/**/noise_multiplier", "/event/**/sampling_probability", "/event/**/count")
declare("sqlite:entries", Kind.DP, "/epsilon_upper", "/event/**/epsilon")
# which records a content hash holds: keyed hashes (the home's secret key), an identity like the content hash
declare("sqlite:record_sets", Kind.IDENTITY, "/content_hash", "/sketch")
declare("sqlite:record_sets", Kind.COUNT, "/records")
declare("sqlite:sqlite_sequence", Kind.IDENTITY, "/seq")  # row numbers of a shared database
declare("sqlite:budget_changes", Kind.IDENTITY, "/id")


def real_records_spend(config, data_hash: str, run_id: str, delta: float) -> ledger.Spend:
    """Real private records placed in prompts with no noise (random-real demos, the non-private reference
    audit): an infinite spend (`dpcore.fewshot.plan.real_records_plan`), purpose "baseline"."""
    return real_records_plan(RANDOM_REAL, config.mechanism, delta).requests(config.ledger_id, data_hash, run_id)[0]


def non_private_baselines(config) -> list[str]:
    """The non-private baselines a configuration opted into (each an infinite spend)."""
    chosen = [b for b in NON_PRIVATE_BASELINES if b in config.baselines]
    if any(math.isinf(e) for e in config.epsilons) and SIGMA_ZERO not in chosen:
        chosen.insert(0, SIGMA_ZERO)
    if config.audit.enabled and config.audit.reference:
        chosen.append(AUDIT_REFERENCE)
    return chosen


def non_private_warning(config) -> str | None:
    """One line said before a run that spends privacy without noise (None when it does not)."""
    chosen = non_private_baselines(config)
    if not chosen:
        return None
    return (f"WARNING: non-private baseline(s) {', '.join(chosen)} requested: each is charged to ledger id "
            f"'{config.ledger_id}' as an infinite spend (epsilon = inf) before the run starts; a budget on "
            f"'{config.ledger_id}' refuses it, and once recorded every later run on '{config.ledger_id}' under a "
            "budget is refused.")


def preflight(config) -> dict:
    """Checks that could otherwise fail after the charge: the task runner spec, the model (resolvable
    without loading its weights) and `max_tokens` within its context. Returns {"context_length": n}."""
    from dpcore.config import check_task_runner

    check_task_runner(config.task_runner)
    return {"context_length": check_context(config)}


def check_context(config) -> int:
    """T_max token steps need room in the model's context next to the prompt (instruction and records);
    the model is resolved, its weights not loaded. Returns the context length."""
    from dpcore.lm.models import context_length
    from tasks.common import TINY_MODEL_NAMES

    limit = TINY_CONTEXT_LENGTH if config.model in TINY_MODEL_NAMES else context_length(config.model)
    check_max_tokens(config.max_tokens, limit, config.model)
    return limit


def checks_after_ingest(config, num_test: int, labels: list[str], generation_config) -> None:
    """The checks that need the ingested data, run before the charge: `--test-size` within the test
    split, and the longest group prompt (N records at the public cap) within the model's context."""
    from dpcore.data.taskspec import load_task_spec
    from dpcore.lm.icl import check_test_size

    check_test_size(config.test_size, num_test)
    check_group_prompt(config.model, load_task_spec(config.task_spec or config.dataset), labels, generation_config)


def check_group_prompt(model: str, spec, labels: list[str], generation_config) -> None:
    """The longest group prompt (N records at the public cap, and T_max tokens) fits the model's context
    (tokenizer and config only, no weights)."""
    from dpcore.lm.budget import check_model_budget

    check_model_budget(model, spec, labels, generation_config)


def check_max_tokens(max_tokens: int, limit: int, model: str) -> None:
    """T_max token steps need room in the model's context next to the prompt (instruction and records)."""
    if max_tokens >= limit:
        raise ConfigError(f"{flag('max_tokens')}: {max_tokens} token steps do not fit the context of model "
                          f"{model!r} ({limit} positions, shared with the prompt); use fewer than {limit}")


def charge_plans(dataset_id: str, data_hash: str, run_id: str, plans, dry_run: bool = False,
                 fresh: bool = False, same_records_ok: bool = False) -> dict:
    """`charge_spends` of the spends of `dpcore.privacy.plan.PrivacyPlan`s (`plan_spends`): every plan of a
    run (any method) in one transaction, with the same flags. A plan with no spends reads no private
    record and is never charged."""
    return charge_spends(dataset_id, plan_spends(dataset_id, data_hash, run_id, plans), dry_run=dry_run,
                         fresh=fresh, same_records_ok=same_records_ok)


def plan_spends(dataset_id: str, data_hash: str, run_id: str, plans) -> list[tuple[str, float, ledger.Spend]]:
    """(method, epsilon, request) of every spend of `dpcore.privacy.plan.PrivacyPlan`s."""
    return [(p.method, p.epsilon, request) for p in plans for request in p.requests(dataset_id, data_hash, run_id)]


def planned_cost(spends: list[tuple[str, float, ledger.Spend]]) -> dict:
    """The composed privacy cost of a run's spends, as the ledger composes them (`ledger.compose_epsilon`
    at the smallest delta among them), overall and per method. Public: parameters only."""
    if not spends:
        return {"epsilon": 0.0, "delta": None, "methods": {}}
    delta = min(request.delta for _, _, request in spends)
    methods: dict[str, list] = {}
    for method, _, request in spends:
        methods.setdefault(method, []).append(request)

    def composed(requests) -> float:
        return float(ledger.compose_epsilon(requests, delta).epsilon)

    return {"epsilon": composed([r for _, _, r in spends]), "delta": delta,
            "methods": {m: composed(requests) for m, requests in methods.items()}}


def charge_spends(dataset_id: str, spends: list[tuple[str, float, ledger.Spend]],
                  dry_run: bool = False, fresh: bool = False, same_records_ok: bool = False) -> dict:
    """The one charging path: (method, epsilon, request) spends, charged in ONE all-or-nothing
    transaction (`Ledger.charge`: a spend the ledger already holds for this run id is replayed, charged
    nothing; `fresh`: every spend charged anew, `replay_recorded=False`), or refused
    (`BudgetExceededError`, exit 3) before anything is recorded. Returns a public summary
    (`ledger_entries`: the entries this call recorded). Records another dataset id already spends on are
    refused (`SameRecordsError`, exit 3) unless `same_records_ok` (`--new-budget-for-same-records`).

    `noise_charged` lists the (method, epsilon, k) of every spend this call charged: only their stages
    may draw fresh noise; the others replay a recorded spend and must come from the cached draw.
    """
    book = ledger.Ledger()
    requests = [request for _, _, request in spends]
    outcome = book.charge(requests, replay_recorded=not fresh, dry_run=dry_run,
                          same_records_ok=same_records_ok)
    # Identical requests (trainings of one plan) are told apart by position: an earlier attempt charged
    # the first ones, so the ledger's records replay the earliest and the new charges are the latest.
    pending = list(outcome.new_requests)
    is_new = [False] * len(spends)
    for index in range(len(spends) - 1, -1, -1):
        found = next((i for i, r in enumerate(pending) if r == spends[index][2]), None)
        if found is not None:
            is_new[index] = True
            pending.pop(found)
    # Each spend is named by (method, epsilon, k): the k-th spend of that method and epsilon in plan order
    # (a DP-SGD training, a PromptPATE step, a generation), so a retry that adds spends (more trainings)
    # never lets an old spend's stage draw fresh noise under its earlier charge.
    charged, seen = [], {}
    for (m, e, _), new in zip(spends, is_new, strict=True):
        k = seen.get((m, e), 0)
        seen[(m, e)] = k + 1
        if new:
            charged.append((m, e, k))
    summary = {
        "dataset_id": dataset_id,
        "dry_run": dry_run,
        "charged": 0 if dry_run else len(outcome.charged),
        "replayed": len(outcome.recorded),
        "noise_charged": [[m, "inf" if math.isinf(e) else e, k] for m, e, k in charged],
        "entries": [{"method": m, "epsilon": "inf" if math.isinf(e) else e, "purpose": r.purpose,
                     "noise_multiplier": r.noise_multiplier, "sampling_rate": r.sampling_rate, "steps": r.steps,
                     "delta": r.delta, "new": new} for (m, e, r), new in zip(spends, is_new, strict=True)],
        "ledger_entries": [entry.to_dict() for entry in outcome.charged],
    }
    if not dry_run:
        spend = book.spend(dataset_id)
        summary.update(total_epsilon="inf" if math.isinf(spend.epsilon) else spend.epsilon, delta=spend.delta,
                       budget=spend.budget.to_dict() if spend.budget else None)
    return summary


def budget_delta(dataset_id: str) -> float | None:
    """The delta of the dataset's budget, or None when no budget is set (the CLI's default delta)."""
    budget = ledger.Ledger().get_budget(dataset_id)
    return float(budget.delta) if budget is not None else None


def noise_charged(summary: dict, method: str, epsilon: float, spend: int | None = None) -> bool:
    """Whether this attempt charged the spend(s) a stage draws noise for, so fresh noise is covered:
    `spend` k, the k-th spend of (method, epsilon) (a DP-SGD training); None, every spend of (method,
    epsilon) (a stage that draws for the whole plan). Keyed on each spend, as the ledger is: seeded or
    not, a stage never draws again under a charge an earlier attempt made."""
    eps = "inf" if math.isinf(epsilon) else float(epsilon)
    mine = [entry for entry in summary["entries"] if entry["method"] == method and entry["epsilon"] == eps]
    if not mine:
        return False
    if spend is not None:
        return [method, eps, spend] in summary["noise_charged"]
    return all(entry["new"] for entry in mine)


def ledger_report(dataset_id: str, run_id: str) -> dict:
    """The dataset's composed spend after the run, with this run's entries (pipeline, baselines, audit)."""
    book = ledger.Ledger()
    spend = book.spend(dataset_id)
    mine = [e for e in spend.entries if e.run_id == run_id]
    return {
        "dataset_id": dataset_id,
        "epsilon": "inf" if math.isinf(spend.epsilon) else spend.epsilon,
        "delta": spend.delta,
        "entries_total": len(spend.entries),
        "entries_this_run": len(mine),
        "purposes_this_run": sorted({e.purpose for e in mine}),
        "budget": spend.budget.to_dict() if spend.budget else None,
    }


def audit_charge_hook(dataset_id: str | None, data_hash: str, run_id: str | None, plan) -> Callable[[int], None]:
    """The `charge(demo_set)` callback of `dp_audit`: demo set i charges the i-th spend of the audit's
    `PrivacyPlan` (always anew: each demo set draws fresh noise). A missing dataset id or run id is an
    error: an audit's DP generations always spend privacy."""
    if not dataset_id or not run_id:
        raise ConfigError(f"audit: cannot charge the audit's DP generations to the ledger without a dataset id "
                          f"and a run id (got dataset id {dataset_id!r}, run id {run_id!r})")
    requests = plan.requests(dataset_id, data_hash, run_id)
    book = ledger.Ledger()

    def charge(demo_set: int) -> None:
        book.charge([requests[demo_set]], replay_recorded=False)

    return charge


# --------------------------------------------------------------------------- `dpicl ledger`


def ledger_spends(path: str | None, dataset_id: str | None = None, delta: float | None = None) -> tuple[str, list]:
    """(the ledger file, the composed `dpcore.privacy.ledger.DatasetSpend` of `dataset_id`, or of every dataset id the ledger
    holds), composed at `delta` (None: the budget's delta, else the smallest entry delta)."""
    book = ledger.Ledger(path)
    known = book.dataset_ids()
    if dataset_id and dataset_id not in known:
        raise ConfigError(f"--dataset {dataset_id}: unknown dataset id; the ledger {book.path} holds "
                          + (", ".join(known) if known else "no dataset yet"))
    return str(book.path), [book.spend(one, delta=delta) for one in ([dataset_id] if dataset_id else known)]


def set_budget(path: str | None, dataset_id: str, epsilon: float, delta: float, allow_raise: bool = False) -> tuple:
    """Set, lower or raise a dataset id's (epsilon, delta) budget (`dpcore.privacy.ledger.Ledger.set_budget`: raising
    a spent budget needs `allow_raise`): (the change, the dataset's composed spend)."""
    book = ledger.Ledger(path)
    change = book.set_budget(dataset_id, epsilon, delta, allow_raise=allow_raise)
    return change, book.spend(dataset_id)


def record_spend(path: str | None, request: dict) -> tuple:
    """Record a spend made outside dpicl: T Poisson-sampled steps (`dpcore.privacy.spend.Spend.sampled_steps`'
    arguments with the dataset id, content hash, run id and delta), refused beyond the budget
    (`BudgetExceededError`, exit 3): (the entry, the dataset's composed spend)."""
    book = ledger.Ledger(path)
    entry = book.charge([ledger.Spend.sampled_steps(**request)], replay_recorded=False).charged[0]
    return entry, book.spend(request["dataset_id"])


def epsilon_report(noise_multiplier: float, sampling_rate: float, steps: int, delta: float, mechanism: str,
                   cache: bool = True):
    """The `dpcore.fewshot.accounting.PrivacyReport` of T Poisson-sampled steps at (sigma, q), at delta
    (`cache=False`: neither read nor write the accounting cache)."""
    from dpcore.fewshot import accounting

    return accounting.epsilon_for(noise_multiplier, sampling_rate, steps, delta, mechanism=mechanism,
                                  cache_dir=None if cache else False)


def sigma_report(target_epsilon: float, sampling_rate: float, steps: int, delta: float, mechanism: str,
                 cache: bool = True):
    """The smallest sigma whose upper-bound epsilon is at most `target_epsilon`, as a `PrivacyReport`."""
    from dpcore.fewshot import accounting

    return accounting.calibrate(target_epsilon, sampling_rate, steps, delta, mechanism=mechanism,
                                cache_dir=None if cache else False)
