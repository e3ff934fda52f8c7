"""Every method's privacy plans for one run, from the data alone (no model, no Prefect server, nothing
written): what the CLI shows and dry-runs before anything starts, and what the pipeline charges in one
transaction after ingest (`tasks.charge`).

- `method_plans`: PromptPATE's and PromptDPSGD's plans, each after its own checks on the data
  (`tasks.pate`, `tasks.tune`); DP few-shot generation's come from its `FewShotPlan` (`tasks.calibrate`).
- `ingested_method_plans`: the same on the data a pipeline run ingested.
- `run_spends`: the spends of every method a run names, DP few-shot generation's included.

Apart from `tasks.charge`, which the methods' stages call to charge their plans, so that the charging
path imports no method.
"""

from __future__ import annotations

from dpcore.errors import ConfigError
from dpcore.privacy import ledger
from tasks.charge import plan_spends


def method_plans(config, data, delta: float) -> list:
    """The `PrivacyPlan`s of the run's PromptPATE and PromptDPSGD, each after its own checks on the data
    (`tasks.pate.check_inputs`: the flock size, the public queries; `tasks.tune.plans`: batch within the
    training records). DP few-shot generation's come from its `FewShotPlan` (`tasks.calibrate`)."""
    plans = []
    if "pate" in config.methods:
        from tasks.pate import check_inputs, privacy_plans

        _, _, settings = check_inputs(config, data)
        plans += privacy_plans(config, settings, delta)[0]
    if "dpsgd" in config.methods:
        from dpcore.lm.icl import check_test_size
        from tasks.tune import plans as dpsgd_plans

        if data.spec.kind != "classification":
            raise ConfigError(f"methods: PromptDPSGD trains prompts for classification tasks; task "
                              f"{data.spec.name!r} is {data.spec.kind}")
        check_test_size(config.test_size, len(data.test))
        plans += dpsgd_plans(config, len(data.train))
    return plans


def ingested_method_plans(config, ingested: dict, delta: float) -> list:
    """`method_plans` on the data a pipeline run ingested (refused if the file changed since)."""
    from dpcore.errors import DpiclError
    from tasks.ingest import load_data

    if not set(config.methods) - {"tang"}:
        return []
    data = load_data(config)
    if data.content_hash != ingested["data_hash"]:
        raise DpiclError("methods: the dataset changed since it was ingested (content hash differs); run again")
    return method_plans(config, data, delta)


def run_spends(config, run_id: str | None = None) -> tuple[list[tuple[str, float, ledger.Spend]], object]:
    """Every spend the run will charge, for every method it names, from the data and the accountant
    alone (no model, no Prefect server, nothing written): (spends, the loaded dataset). DP few-shot
    generation's plan is the one the pipeline's calibration stage makes (`tasks.calibrate.plan_arguments`)."""
    from dpcore.fewshot.plan import default_delta, fewshot_plan
    from tasks.calibrate import plan_arguments
    from tasks.ingest import load_data

    data = load_data(config)
    run_id = run_id or "dry-run"
    delta = config.delta if config.delta is not None else default_delta(len(data.train))
    plans = []
    if "tang" in config.methods:
        plans += fewshot_plan(**plan_arguments(config, data.label_counts(), delta)).privacy_plans()
    plans += method_plans(config, data, delta)
    return plan_spends(config.ledger_id, data.content_hash, run_id, plans), data
