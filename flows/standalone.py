"""The pipeline's stages for one command, run in this process without a Prefect server:
`dpicl generate`, `dpicl audit` and `dpicl evaluate`.

Each composes the task functions the pipeline runs: the data (`tasks.ingest.load_data`), the
privacy plan (`dpcore.fewshot.plan` through `tasks.calibrate` / `tasks.audit.audit_plan`), the
checks and the charge (`tasks.charge`, fresh: each command draws fresh noise and is charged anew,
never replayed), the model cache (`tasks.common.language_model`), generation
(`tasks.generate.generate_for`), evaluation (`tasks.evaluate.evaluate_pool`) and the audit's pieces
(`tasks.audit`). Every check that could fail runs before the charge, and the charge (or its
refusal, exit 3) before any private record is read; a budget refusal comes before the model loads.

A command writes its public folder (`--out DIR` or `$DPICL_HOME/runs/<dataset>/<hash12>/<kind>-<UTC
time>-<hex>/`, sealed with a manifest) and its private counterpart under `$DPICL_HOME/private/`, and
returns a public summary; `say` receives the lines a person must read before anything is spent
(warnings). Nothing here parses arguments or prints.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from dpcore.audit.config import AuditConfig
from dpcore.config import RunConfig, demos_per_label
from dpcore.data.artifacts import (
    check_writable_place,
    jsonable,
    read_table,
    write_json_atomic,
    write_manifest,
    write_table,
)
from dpcore.display import fmt_delta
from dpcore.display import fmt_eps as _eps
from dpcore.errors import ConfigError, DataValidationError
from dpcore.fewshot.plan import (
    AUDIT_REFERENCE,
    INSTRUCTION_ONLY,
    RANDOM_REAL,
    SIGMA_ZERO,
    default_delta,
    demos_epsilon,
    fewshot_plan,
    real_records_plan,
)
from dpcore.fewshot.sampling import ACCOUNTED_SAMPLERS
from dpcore.home import dpicl_home, private_dir
from dpcore.names import DEMO_SOURCES, method_name
from dpcore.public_outputs import Kind, declare, declare_line
from tasks.calibrate import generation_config
from tasks.charge import charge_plans, check_context, check_group_prompt
from tasks.common import language_model
from tasks.evaluate import endpoint_scorers, evaluate_pool
from tasks.generate import check_generation, empty_demos_note, generate_for, report_steps, step_line
from tasks.ingest import load_data

Say = Callable[[str], None]
log = logging.getLogger(__name__)
# The `--json` keys of `dpicl audit` (docs/json.md): the design and the verdict. The figures (AUCs,
# intervals, TPRs, epsilon lower bounds, overlap, the strongest attack) are statistics of private
# records: they go to the private folder's `audit.json` (the operator's diagnostic), never to --json.
AUDIT_KEYS = ("setting", "dataset", "model", "epsilon", "noise_multiplier", "delta", "confidence", "crosscheck_agreed",
              "trials", "demo_sets", "members_per_trial", "non_members_per_trial", "test", "leak_auc", "power",
              "false_alarm", "passed", "reasons")
PRIVATE_AUDIT_KEYS = AUDIT_KEYS + ("attack", "auc", "auc_ci", "auc_ci_method", "attacks", "pooled_auc",
                                   "tpr_at_1pct_fpr", "tpr_at_01pct_fpr", "epsilon_lower_bound",
                                   "epsilon_lower_bound_method", "max_overlap_tokens", "overlapping_records",
                                   "overlap_threshold", "seconds")

# The commands' public summaries (--json and the same object in the output folder). Generation: the demos and
# the counters of them alone are DP outputs; sigma, q and the accountant's epsilons follow from |D_y|.
for _output in ("json:generate", "file:*generation.json"):
    declare(_output, Kind.DP, "/demos", "/stats")
    declare(_output, Kind.COUNT, "/noise_multiplier", "/sampling_rate", "/epsilon", "/epsilon_lower",
            "/epsilon_crosscheck", "/limiting_label", "/per_label_epsilon/*")
    declare(_output, Kind.IDENTITY, "/content_hash")
# Evaluation: accuracies of a DP prompt on test items; the time spent scoring them (public work); the epsilon
# accounted from the demos' sigma and |D_y|.
for _output in ("json:evaluate", "file:*summary.json"):
    declare(_output, Kind.DP, "/accuracy", "/calibrated_accuracy")
    declare(_output, Kind.PUBLIC_TIMING, "/seconds", "/seconds_per_100_items")
    declare(_output, Kind.COUNT, "/epsilon")
    declare(_output, Kind.IDENTITY, "/data_hash")
declare_line(Kind.COUNT, r"^dpicl evaluate: epsilon (\S+) accounted from the demos' noise multiplier")
# The audit: its design follows from the configuration and |D_y|; the gate's verdict is its one public bit.
for _output in ("json:audit", "file:*audit.json"):
    declare(_output, Kind.VERDICT, "/verdict", "/passed", "/reasons", "/reference/verdict", "/reference/passed",
            "/reference/reasons")
    declare(_output, Kind.COUNT, "/epsilon", "/noise_multiplier", "/privacy/epsilon", "/privacy/noise_multiplier",
            "/privacy/sampling_rate", "/power", "/reference/power")  # power: of the sizes, set from |D_y|
    declare(_output, Kind.IDENTITY, "/content_hash")

# --------------------------------------------------------------------------- folders


def check_out(out: Path) -> Path:
    """`--out` must be a folder this process can write, checked before anything is charged (nothing is
    created here: the first existing ancestor must be a writable folder)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):  # its manifest would hash files this command did not write
        raise ConfigError(f"--out {out}: the folder is not empty; name a new or empty folder")
    check_writable_place(out, "--out", out)
    return out


def folders(data, out: Path | None, kind: str) -> tuple[Path, Path]:
    """(the command's public folder, its private counterpart); the folder's name is the run id."""
    if out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = dpicl_home() / "runs" / data.spec.name / data.content_hash[:12] / f"{kind}-{stamp}-{secrets.token_hex(2)}"
    check_out(out)
    return out, private_dir() / "runs" / data.spec.name / data.content_hash[:12] / out.name


def _delta(config: RunConfig, data) -> float:
    return config.delta if config.delta is not None else default_delta(len(data.train))


def _charge(config: RunConfig, data, run_id: str, plans, dry_run: bool = False) -> list[dict]:
    """Every spend of `plans` charged anew (each command draws fresh noise); the entries recorded."""
    if not plans:
        return []
    return charge_plans(config.ledger_id, data.content_hash, run_id, plans, dry_run=dry_run,
                        fresh=True, same_records_ok=config.new_budget_for_same_records)["ledger_entries"]


def _real_records(config: RunConfig, data, run_id: str, name: str, say: Say, warning: str) -> list:
    """Real records in prompts: an infinite spend, said and budget-checked before the model loads."""
    say(warning)
    plans = [real_records_plan(name, config.mechanism, _delta(config, data))]
    _charge(config, data, run_id, plans, dry_run=True)
    return plans


# --------------------------------------------------------------------------- dpicl generate


def _generation_privacy(calibration) -> dict:
    """The privacy fields of `dpicl generate`'s summary (epsilon 0: no private record, no noise calibrated)."""
    if not calibration.reads_private_data:
        return {"epsilon": 0.0, "delta": 0.0, "noise_multiplier": math.inf, "sampling_rate": 0.0,
                "steps": calibration.steps, "mechanism": calibration.mechanism, "warnings": []}
    privacy = {"epsilon": calibration.epsilon_upper, "target_epsilon": calibration.epsilon, "delta": calibration.delta,
               "noise_multiplier": calibration.noise_multiplier, "sampling_rate": calibration.sampling_rate,
               "steps": calibration.steps, "mechanism": calibration.mechanism,
               "limiting_label": calibration.limiting_label, "per_label_epsilon": dict(calibration.per_label_epsilon)}
    if calibration.method == SIGMA_ZERO:  # sigma = 0: nothing calibrated, no accountant figures to report
        return {**privacy, "crosscheck_agreed": True, "warnings": []}
    return {**privacy, "epsilon_lower": calibration.epsilon_lower, "epsilon_crosscheck": calibration.epsilon_crosscheck,
            "crosscheck_agreed": calibration.crosscheck_agreed, "warnings": list(calibration.warnings)}


def generate(config: RunConfig, epsilon: float, out: Path | None, say: Say) -> tuple[dict, list]:
    """DP few-shot generation alone (Tang et al. Algorithm 1) for every label at one epsilon ('inf': sigma 0;
    0: instruction-only): (the public summary written to `generation.json`, the demos)."""
    # torch loads here, not when the module is imported
    from dpcore.fewshot.generation import demos_frame

    began = time.perf_counter()
    if out is not None:
        check_out(out)
    data = load_data(config)
    labels, counts = data.labels, data.label_counts()
    generation = generation_config(config, len(labels))
    reads_private = epsilon > 0
    # Every check that can fail runs before the charge; the budget refusal before the model loads.
    check_generation(generation, label_counts=counts if reads_private else None)
    if reads_private:  # the longest group prompt fits the model's context (tokenizer only)
        check_group_prompt(config.model, data.spec, labels, generation)
    plan = fewshot_plan([epsilon], counts, generation, _delta(config, data), purpose="generate")
    calibration = plan.calibration(epsilon)
    out, private_out = folders(data, out, "generate")
    run_id = out.name
    if math.isinf(epsilon):
        say(f"WARNING: --epsilon inf generates without noise (sigma = 0): charged to ledger id '{config.ledger_id}' "
            "as an infinite spend; the demos carry no privacy guarantee.")
    _charge(config, data, run_id, plan.privacy_plans(), dry_run=True)  # BudgetExceededError (exit 3), in seconds
    check_context(config)
    lm = language_model(config.model, config.device, config.dtype)
    check_generation(generation, vocab_size=lm.vocab_size)

    what = f"generate {calibration.method} eps={_eps(epsilon)} ({', '.join(labels)})"

    def progress(info: dict) -> None:  # public counters only (tokens/s depends on the records' lengths)
        report_steps(f"generate eps={_eps(epsilon)}: token steps", info)
        log.info(step_line(what, info))

    # ---- PRIVACY LEDGER: the spend is charged (or refused, exit 3) BEFORE any private record is read.
    entries = _charge(config, data, run_id, plan.privacy_plans())
    records = {label: data.records_for(label) for label in labels} if reads_private else None  # private, in memory
    result = generate_for(lm, data.spec, calibration.method, labels, generation, calibration.noise_multiplier,
                          records_by_label=records, seed=config.seed, progress=progress)
    frame = demos_frame(result.demos)
    note = empty_demos_note(frame, "generated")
    if note:
        say(f"WARNING: {note}")
    write_table(frame, out / "demos.parquet")
    wall_seconds = time.perf_counter() - began
    write_json_atomic(private_out / "generation_stats.json",
                      jsonable({"run_id": run_id, "wall_seconds": wall_seconds, "stats": result.stats,
                                 "private_stats": result.private_stats}))
    summary = {
        "run_id": run_id, "dataset": data.spec.name, "content_hash": data.content_hash, "model": config.model,
        **_generation_privacy(calibration), "seeded_noise": result.seeded_noise,
        "demos_per_label": generation.demos_per_label, "labels": labels, "config": generation.model_dump(),
        "stats": result.stats, "ledger_entry": entries[0] if entries else None,
        # no wall time: it depends on the sampled records' lengths (generation_stats.json, private, keeps it)
    }
    write_json_atomic(out / "generation.json", jsonable(summary))
    write_manifest(out, {"run_id": run_id, "kind": "generate"})
    return {**summary, "out": str(out)}, result.demos


# --------------------------------------------------------------------------- dpicl audit


def _audit_line(audit_config: AuditConfig, train, labels: list[str], epsilon: float | None) -> str:
    """What the audit will run, said before the model loads (`tasks.audit.design_line`): the design of the
    sizes asked on this split's public counts."""
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run
    from tasks.audit import design_line

    sizes = dict(trials=audit_config.trials,
                 **audit_design.settings(audit_config, len(attacks_run(audit_config.reference_prompts))))
    if epsilon is None:  # one real record (the member) vs non-members of the whole split, per trial
        slots = len(train) // (1 + audit_config.non_members)  # trials drawn disjointly from the one split
        chosen = audit_design.plan(slots, slots * audit_config.non_members, members=1,
                                   non_members=audit_config.non_members, **sizes)
        return design_line(audit_config, chosen)
    counts = train["label"].astype(str).value_counts()
    members = [int(round(0.5 * int(counts.get(y, 0)))) for y in labels]  # `audit_members`: half of each label
    non_members = [int(counts.get(y, 0)) - m for y, m in zip(labels, members, strict=True)]
    chosen = audit_design.plan_by_label(members, non_members, demo_sets=audit_config.demo_sets,
                                        members=audit_config.members, non_members=audit_config.non_members, **sizes)
    return design_line(audit_config, chosen, audit_config.demo_sets)


def audit(config: RunConfig, audit_config: AuditConfig, epsilon: float | None, reference: bool, out: Path | None,
          say: Say, reference_sized: bool = True) -> tuple[object, object, dict]:
    """The membership-inference audit of one setting (Duan et al. 2023; Tang et al. Appendix F):
    `epsilon=None` real records as 1-shot demos (non-private); else DP demo sets generated at `epsilon`
    from half the private records (the members; each set charged), and with `reference` the non-private
    audit beside it. The non-private audit runs the cheapest design that detects the configured leak
    (`tasks.audit.reference_design`) unless `reference_sized` is False (the user set its sizes). Returns (the
    audit, the reference or None, the public summary written to `audit.json`)."""
    # torch, scipy load here, not when the module is imported
    from dpcore.audit.gate import GateThresholds
    from tasks.audit import (
        audit_members,
        audit_plan,
        design_line,
        dp_audit_at,
        reference_audit,
        reference_design,
        write_audit,
    )

    data = load_data(config)
    if data.spec.kind != "classification":
        raise ConfigError(f"dataset: task {data.spec.name!r} is {data.spec.kind}; the membership audit scores "
                          "class labels")
    train, spec, delta = data.train, data.spec, _delta(config, data)
    # The member/non-member split and the trial draws: an audit design choice, not privacy noise.
    # Reproducible: --seed when given, else derived from the data's content hash.
    seed = int(config.seed) if config.seed is not None else int(data.content_hash[:15], 16)
    thresholds = GateThresholds.from_config(audit_config)
    out, private_out = folders(data, out, "audit")
    run_id = out.name

    plans, calibration, privacy = [], None, None
    if epsilon is not None:
        members, non_members, member_counts = audit_members(train, seed, data.labels)
        generation = config.generation_config().model_copy(update={"demos_per_label": 1})
        # Parameter errors before anything expensive (the vocabulary check follows the model load).
        check_generation(generation, label_counts=member_counts if epsilon > 0 else None)
        if epsilon > 0:  # the longest group prompt fits the model's context (tokenizer only, before the charge)
            check_group_prompt(config.model, spec, data.labels, generation)
        plan = audit_plan(generation, member_counts, epsilon, delta, audit_config.demo_sets)
        calibration, plans = plan.calibration(epsilon), plan.privacy_plans()
        privacy = {"epsilon": calibration.epsilon_upper,
                   "noise_multiplier": calibration.noise_multiplier if calibration.reads_private_data else math.inf,
                   "sampling_rate": calibration.sampling_rate, "steps": calibration.steps, "delta": delta,
                   "crosscheck_agreed": calibration.crosscheck_agreed, "warnings": list(calibration.warnings)}
        _charge(config, data, run_id, plans, dry_run=True)  # all demo sets at once: the refusal before the model
    reference_config, line = audit_config, None
    if (epsilon is None or reference) and reference_sized:
        reference_config, chosen = reference_design(audit_config, len(train))
        line = design_line(reference_config, chosen) if epsilon is None else None
    say(line or _audit_line(audit_config, train, data.labels, epsilon))
    real = []
    if epsilon is None or reference:
        real = _real_records(config, data, run_id, AUDIT_REFERENCE, say,
                             "WARNING: the non-private audit puts real private records in prompts: it is charged to "
                             f"ledger id '{config.ledger_id}' as an infinite spend (epsilon = inf); a budget on it "
                             "refuses the audit.")
    lm = language_model(config.model, config.device, config.dtype)
    entries = _charge(config, data, run_id, real)

    result, ref = None, None
    if epsilon is None:
        result = reference_audit(lm, spec, train, reference_config, seed=seed, sample_seed=seed, delta=delta,
                                 thresholds=thresholds, what="audit: trials")
    else:
        check_generation(generation, vocab_size=lm.vocab_size)
        # ---- PRIVACY LEDGER: every demo set's generation from the members, charged at once before any is made
        entries += _charge(config, data, run_id, plans)
        result = dp_audit_at(lm, spec, members, non_members, audit_config, generation, calibration, seed=seed,
                             noise_seed=config.seed, crosscheck_agreed=calibration.crosscheck_agreed,
                             thresholds=thresholds, what="audit: demo sets")
        if reference:
            ref = reference_audit(lm, spec, train, reference_config, seed=seed + 1, sample_seed=seed, delta=delta,
                                  thresholds=thresholds, what="audit: non-private reference trials")
    # Every figure of the audit stays private (the operator's diagnostic); the public folder and --json
    # keep the design and the verdict.
    write_audit([result], ref, out, private_out, f"{spec.name}: membership inference ROC")
    summary = {key: result.summary()[key] for key in AUDIT_KEYS}
    summary.update(verdict=result.public_summary()["verdict"], run_id=run_id, out=str(out),
                   private_out=str(private_out), content_hash=data.content_hash,
                   privacy=privacy, ledger_entries=len(entries), seeded_noise=config.seed is not None)
    # no wall time in the public summary: it depends on the members' lengths (the diagnostic's `seconds`)
    diagnostic = {key: result.summary()[key] for key in PRIVATE_AUDIT_KEYS}
    if ref is not None:
        summary["reference"] = {**{key: ref.summary()[key] for key in AUDIT_KEYS},
                                "verdict": ref.public_summary()["verdict"]}
        diagnostic["reference"] = {key: ref.summary()[key] for key in PRIVATE_AUDIT_KEYS}
    write_json_atomic(private_out / "audit.json", jsonable(diagnostic))
    write_json_atomic(out / "audit.json", jsonable(summary))
    write_manifest(out, {"run_id": run_id, "kind": "audit"})
    return result, ref, summary


# --------------------------------------------------------------------------- dpicl evaluate


def demos_from_file(path: str, method_filter: str | None, epsilon_flag: float | None, data, delta: float | None,
                    say: Say) -> tuple[list, str, float]:
    """(pool, method, epsilon) from a demos Parquet written by `dpcore.fewshot.generation.demos_frame`: its epsilon
    column, else inf for sigma-zero / random-real and 0 for instruction-only, else accounted from the demos'
    noise multiplier and generation settings (`dpcore.fewshot.plan.demos_epsilon`; NaN when the file lacks a
    setting or used a sampler the accountant does not cover)."""
    file = Path(path)
    if not file.exists():
        raise DataValidationError(f"{file}: demos file not found")
    try:
        frame = read_table(file)  # a file written before tang was named so says dp: read as tang
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DataValidationError(f"{file}: not a readable Parquet file ({type(exc).__name__})") from None
    for column in ("label", "text"):
        if column not in frame.columns:
            raise DataValidationError(f"{file}: missing column {column!r} (found: {', '.join(frame.columns)})")
    if method_filter is not None:
        if "method" not in frame.columns:
            raise ConfigError(f"--method: {file} has no method column")
        frame = frame[frame["method"] == method_name(method_filter)]  # --method dp: the old name of tang
    methods = sorted(set(frame["method"].astype(str))) if "method" in frame.columns else ["tang"]
    if len(methods) > 1:
        raise ConfigError(f"--demos: {file} holds demos of several methods ({', '.join(methods)}); pass --method")
    if not len(frame):
        raise DataValidationError(f"{file}: no demos" + (f" of method {method_filter!r}" if method_filter else ""))
    method = methods[0]
    if method not in DEMO_SOURCES:
        raise DataValidationError(f"{file}: column 'method': unknown method {method!r}")
    for column in ("epsilon", "noise_multiplier"):
        if column in frame.columns and frame[column].nunique(dropna=False) > 1:
            raise ConfigError(f"--demos: {file} mixes several values of {column}; split the file per epsilon")
    if epsilon_flag is not None:
        epsilon = epsilon_flag
    elif "epsilon" in frame.columns:
        epsilon = float(frame["epsilon"].iloc[0])
    elif method in ("sigma-zero", RANDOM_REAL) or (
            "noise_multiplier" in frame.columns and float(frame["noise_multiplier"].iloc[0]) == 0.0
            and method != INSTRUCTION_ONLY):
        epsilon = math.inf
    elif method == INSTRUCTION_ONLY:
        epsilon = 0.0
    else:
        delta = delta if delta is not None else default_delta(len(data.train))
        epsilon = _epsilon_of_demos(frame, data, delta)
        if math.isnan(epsilon):
            say(f"dpicl evaluate: warning: {file} records no epsilon and not enough generation settings to "
                "account for it; pass --epsilon E to label the results")
        else:
            say(f"dpicl evaluate: epsilon {_eps(epsilon)} accounted from the demos' noise multiplier "
                f"(delta {fmt_delta(delta)}; --epsilon overrides)")
    pool = [(str(t), str(lab), f"{lab}/{i}") for i, (t, lab) in enumerate(zip(frame["text"], frame["label"],
                                                                            strict=True))]
    return pool, method, epsilon


def _epsilon_of_demos(frame, data, delta: float) -> float:
    needed = ("noise_multiplier", "num_subsets", "subset_size", "max_tokens", "shot")
    if any(column not in frame.columns for column in needed):
        return math.nan
    if "sampler" in frame.columns and not set(frame["sampler"].astype(str)) <= set(ACCOUNTED_SAMPLERS):
        return math.nan
    first = frame.iloc[0]
    shots = {str(label): int(rows["shot"].max()) + 1 for label, rows in frame.groupby("label")}
    return demos_epsilon(float(first["noise_multiplier"]), data.label_counts(), shots, int(first["num_subsets"]),
                         int(first["subset_size"]), int(first["max_tokens"]), delta,
                         str(first["mechanism"]) if "mechanism" in frame.columns else "gaussian")


def _check_sendable(baseline: str | None, method: str | None, epsilon: float | None) -> None:
    """What `--endpoint` may send: DP demos (or none) and the test texts; real records (random-real) and
    demos without a finite guarantee never leave, and instruction-only generation needs a local model."""
    if baseline == RANDOM_REAL or method == RANDOM_REAL:
        raise ConfigError("--endpoint: random-real puts real private records in the prompts; they are never sent "
                          "to an endpoint (evaluate it locally, without --endpoint)")
    if baseline == INSTRUCTION_ONLY:
        raise ConfigError("--endpoint: --baseline instruction-only generates its demos with a local model; make "
                          "them with `dpicl generate --epsilon 0` and pass them with --demos")
    if epsilon is not None and math.isinf(epsilon):
        raise ConfigError(f"--endpoint: the demos are method {method} at epsilon inf (no privacy guarantee); "
                          "they are never sent to an endpoint")


def evaluate(config: RunConfig, *, demos: str | None, method: str | None, epsilon: float | None,
             baseline: str | None, out: Path | None, batch_size: int, max_new_tokens: int, say: Say,
             endpoint=None) -> dict:
    """ICL accuracy (raw and calibrated) of a demos file or of one baseline (zero-shot, instruction-only,
    random-real) over the run's seeds; returns the public summary written to `summary.json`.

    `endpoint` (a `dpcore.release.endpoint.EndpointConfig`): the prompts are scored by that OpenAI-compatible server
    (`--model` names the served model) instead of a local model: DP demos or zero-shot only, the test
    texts sent with them; calibrated only where the server returns log-probabilities."""
    # torch loads here, not when the module is imported
    from dpcore.lm.icl import seconds_per_100_items

    data = load_data(config)
    spec = data.spec
    labels = spec.label_names if spec.kind == "classification" else None
    pool = None
    if demos:
        pool, method, epsilon = demos_from_file(demos, method, epsilon, data, config.delta, say)
    remote, served = None, {"endpoint": None, "scoring": "local", "top_logprobs": None}
    if endpoint is not None:
        _check_sendable(baseline, method, epsilon)
        # before any folder is made: a server that is down is one line and leaves nothing behind
        connection, remote = endpoint_scorers(endpoint, config.model, spec, labels)
        served = {"endpoint": connection.url, "scoring": remote.mode, "top_logprobs": remote.top_logprobs}
        say(f"dpicl evaluate: the test texts and the demos are sent to endpoint {connection.url} "
            f"(model {connection.model}, scoring: {remote.mode})")
    out, private_out = folders(data, out, "evaluate")
    real = []
    if baseline == RANDOM_REAL:  # real private records in the prompts: an infinite spend, charged first
        real = _real_records(config, data, out.name, RANDOM_REAL, say,
                             "WARNING: --baseline random-real uses real private records as demonstrations: charged "
                             f"to ledger id '{config.ledger_id}' as an infinite spend (epsilon = inf).")
        _charge(config, data, out.name, real)
    lm = language_model(config.model, config.device, config.dtype) if remote is None else None
    if baseline == "zero-shot":
        method, epsilon = "zero-shot", 0.0
    elif baseline == INSTRUCTION_ONLY:
        method, epsilon = INSTRUCTION_ONLY, 0.0
        labels = spec.label_names if spec.kind == "classification" else data.labels[: max(1, config.shots)]
        generation = config.generation_config().model_copy(
            update={"demos_per_label": demos_per_label(config.shots, len(labels))})
        made = generate_for(lm, spec, INSTRUCTION_ONLY, labels, generation, 0.0, records_by_label=None,
                            seed=config.seed).demos
        pool = [(d.text, d.label, f"{d.label}/{d.shot}") for d in made]
    elif baseline == RANDOM_REAL:
        method, epsilon = RANDOM_REAL, math.inf
        pool = data.train[["id", "text", "label"]]  # PRIVATE: only ids leave, into the private store
    began = time.perf_counter()
    predictions, metrics, real_ids = evaluate_pool(lm, spec, data.test, pool, method, epsilon, config.eval_config(),
                                                   labels, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                                   remote=remote)
    seconds = time.perf_counter() - began
    if real_ids is not None:
        write_table(real_ids, private_out / "real_demos.parquet")
    # Per-item predictions are private (test ids, gold labels, probabilities); the public side keeps metrics.
    write_table(predictions, private_out / "predictions.parquet")
    write_table(metrics, out / "metrics.parquet")

    def stats(values) -> dict:
        values = [float(v) for v in values]
        return {"mean": float(np.mean(values)), "std": float(np.std(values)), "per_seed": values}

    summary = {
        "dataset": spec.name, "model": config.model if remote is None else connection.model, "method": method,
        "epsilon": float(epsilon), **served,
        "shots": int(metrics["shots"].max()), "seeds": int(len(metrics)), "n": int(metrics["n"].max()),
        "accuracy": stats(metrics["accuracy"]), "calibrated_accuracy": stats(metrics["calibrated_accuracy"]),
        "calibrated": bool(metrics["calibrated"].all()), "seconds": round(seconds),  # whole seconds (public)
        "seconds_per_100_items": seconds_per_100_items(metrics),
        "data_hash": data.content_hash, "demos": str(demos) if demos else None,
        "out": str(out), "private_out": str(private_out),
    }
    write_json_atomic(out / "summary.json", jsonable(summary))
    write_manifest(out)
    return summary
