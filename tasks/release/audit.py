"""The release audit: the membership-inference audit of an artifact audited at its release
(`ReleaseSpec.audit_file`; `dpcore.audit.procedures.prompt_audit`): members are the private records the
mechanism read (`ReleaseSpec.members`), non-members the held-out test records and the records it never read;
nothing is generated and nothing is charged (like the run-demos audit). The opt-in single-teacher contrast
(`dpcore.audit.procedures.teacher_audit`, a teacher assignment's) puts real records in prompts: it is charged
first as an infinite spend (`tasks.charge.real_records_spend`, like the non-private audit reference). Public:
`audit_<method>.parquet` (one row per audited artifact) and `audit_pate_teacher.parquet`; private:
`mia_scores_<method>.parquet`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from prefect import get_run_logger

from dpcore.data.artifacts import read_table, write_table
from dpcore.errors import ConfigError, ReleaseRefusedError
from dpcore.home import dpicl_home
from dpcore.pate.release import TEACHER_AUDIT_FILE, teacher_prompts
from dpcore.public_outputs import Kind, declare, declare_log
from dpcore.release import gate
from dpcore.release.spec import TRAINED_PROMPT, Artifact
from tasks.charge import AUDIT_REFERENCE, charge_spends, real_records_spend
from tasks.common import derive_seed, language_model, report_progress, stop_requested, stoppable_task
from tasks.release.check import load_artifact, release_spec
from tasks.release.sealing import reseal

# A release audit's public tables: its verdict, and the epsilon and noise its artifact was charged.
for _output in ("file:*audit_*.parquet",):
    declare(_output, Kind.VERDICT, "/*/verdict", "/*/passed", "/*/reasons")
    declare(_output, Kind.VERDICT, "/*/summary/verdict", "/*/summary/passed", "/*/summary/reasons")
    declare(_output, Kind.COUNT, "/*/noise_multiplier", "/*/summary/noise_multiplier")
    declare(_output, Kind.DP, "/*/epsilon", "/*/summary/epsilon")
ARTIFACT_AUDIT_LOG = declare_log("audit of %s %s: %s", verdict=(2,))


def _private_folder(artifact: Artifact) -> Path:
    """The run's private folder (`$DPICL_HOME/private/runs/<same path as the public one>`)."""
    from dpcore.home import private_dir

    return private_dir() / artifact.path.relative_to(dpicl_home())


def _sampled_ids(private: Path, artifact: Artifact) -> list[str] | None:
    """The ids of the records a DP-SGD training's Poisson batches drew (its private training record)."""
    path = private / "training" / f"{artifact.name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("sampled_ids")


def _merge_rows(path: Path, frame, name: str):
    """`frame` (rows of artifact `name`) in the table at `path`, replacing that artifact's earlier rows."""
    if path.exists():
        kept = read_table(path)
        kept = kept[kept["artifact"] != name] if "artifact" in kept.columns else kept[:0]
        frame = pd.concat([kept, frame], ignore_index=True)
    return write_table(frame, path)


def planned_audit(audit_config, member_pool: int, non_member_pool: int, size_to_pools: bool,
                  cap_to_pools: bool = False):
    """The audit to run on these pools (`dpcore.audit.design`). `size_to_pools`: the cheapest design that
    concludes, refused (`ReleaseRefusedError`) when none would; otherwise `audit_config`'s sizes (capped to
    the pools when `cap_to_pools`: a pipeline's settings, sized for another method), said in one line when
    they would not conclude, and run as asked."""
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run

    reserve = audit_config.reference_prompts if audit_config.reference_prompts >= 2 else 0
    pools = (member_pool, max(0, non_member_pool - reserve))
    sizes = audit_design.settings(audit_config, len(attacks_run(audit_config.reference_prompts)))
    if size_to_pools:
        chosen = audit_design.cheapest_conclusive(*pools, **sizes)
    else:
        if cap_to_pools:
            audit_config = audit_config.model_copy(update={
                "members": max(1, min(audit_config.members, pools[0])),
                "non_members": max(1, min(audit_config.non_members, pools[1]))})
        chosen = audit_design.plan(*pools, members=audit_config.members, non_members=audit_config.non_members,
                                   trials=audit_config.trials, **sizes)
    refusal = audit_design.cannot_conclude(chosen, *pools, members_are="the records the mechanism read",
                                           non_members_are="the held-out and unread records")
    if refusal is not None and size_to_pools:
        raise ReleaseRefusedError(refusal)
    if refusal is not None:
        get_run_logger().warning("%s (running it with the sizes asked)", refusal)
    elif audit_design.shortfall_note(chosen):
        get_run_logger().warning("%s", audit_design.shortfall_note(chosen))
    if size_to_pools:
        audit_config = audit_config.model_copy(update={"members": chosen.members, "non_members": chosen.non_members,
                                                       "trials": chosen.trials})
    return audit_config


@stoppable_task(name="release-audit", tags=["gpu"], retries=0, persist_result=False)
def audit_artifact(run_id: str, method: str, audit_config, epsilon: float | None = None, training: int = 0,
                   repeat: int | None = None, teacher_reference: bool = False, device: str = "auto",
                   dtype: str = "auto", seed: int | None = None, size_to_pools: bool = False,
                   cap_to_pools: bool = False) -> dict:
    """The membership-inference audit of an artifact audited at its release (`ReleaseSpec.audit_file`: a
    PromptPATE student prompt, a PromptDPSGD trained prompt, a registered method's demonstrations or instruction;
    and, when asked, of single PromptPATE teachers: non-private, charged as an infinite spend first). An audit
    row of the same artifact under the same audit configuration is reused. Returns public summaries.

    Members: the private records the mechanism read (`ReleaseSpec.members`); non-members: the held-out records
    and the private records it never read (a teacher never held them; no Poisson batch drew them). The design is planned
    before the model loads (`planned_audit`): `size_to_pools` takes the cheapest design that concludes on
    these pools instead of `audit_config`'s sizes and refuses (`ReleaseRefusedError`), naming the pool that
    falls short, when none would, before minutes are spent; `cap_to_pools` caps the sizes asked."""
    from dpcore.audit import procedures as mia
    from dpcore.audit.gate import GateThresholds
    from dpcore.data.taskspec import TaskSpec
    from tasks.audit import public_summary

    released = release_spec(method)
    if not released.audited_at_release:
        raise ConfigError(f"--method {method}: its artifact was audited by its own run, not at its release")
    artifact = load_artifact(run_id, method, epsilon, training, repeat)
    if not gate.released_count(artifact):
        raise ConfigError(f"run {run_id}: {released.nothing_releasable}")
    train, members, held_out, assignment = _audit_pools(artifact)
    audit_config = planned_audit(audit_config, *_public_pool_sizes(artifact, train, members, held_out),
                                 size_to_pools, cap_to_pools)
    if artifact.drawn_records is not None and (len(members) < audit_config.members
                                               or len(held_out) < audit_config.non_members):
        # only below the pools' public lower bounds (`_public_pool_sizes`: a one-in-a-million draw): refused
        # without the realised counts, which would reveal the batches' sizes
        raise ReleaseRefusedError(
            f"run {artifact.run_id}: the audit's design needs more of the records the mechanism read (or left "
            "unread) than its sampling drew, a rare draw of the sampling; audit it with fewer --audit-members")
    # an audit asked for with another seed draws other trials: not the stored one
    key = audit_config.model_dump_json()
    if seed is not None:
        key = json.dumps({**json.loads(key), "seed": int(seed)})
    done = _reused_audit(artifact, key, teacher_reference)
    if done is not None:
        return done
    lm = language_model(artifact.info["model"], device, dtype)
    past = None
    if released.applied_to_model is not None:
        lm, past = released.applied_to_model(lm, artifact.prompt_path, artifact.info["model_weights_sha256"],
                                             artifact.info["model"])
    spec = TaskSpec.model_validate(artifact.task_spec)
    split_seed = derive_seed(seed if seed is not None else int(str(artifact.info["data_hash"])[:15], 16),
                             "release-audit")
    thresholds = GateThresholds.from_config(audit_config)
    # a trained prompt's one DP-SGD spend; the other methods' several spends have no one noise multiplier
    noise = artifact.spends[0]["noise_multiplier"] if released.kind == TRAINED_PROMPT else None
    result = mia.prompt_audit(
        lm, spec, list(artifact.demos), members, held_out, audit_config, seed=split_seed, setting="dp",
        epsilon=artifact.epsilon, noise_multiplier=None if noise is None else float(noise), delta=artifact.delta,
        crosscheck_agreed=gate.plan_crosscheck(artifact.spends, artifact.delta), past=past, thresholds=thresholds,
        progress=lambda done, total: report_progress(f"audit {artifact.name}", done, total),
        should_stop=stop_requested)
    out = {"artifact": artifact.name, "reused": False, "audit": public_summary(result)}
    get_run_logger().info(ARTIFACT_AUDIT_LOG, method, artifact.name, out["audit"]["verdict"])
    _write_audit_rows(artifact, key, result, artifact.name, out["audit"])
    results = [result]
    if teacher_reference and assignment is not None:
        reference = _teacher_contrast(lm, spec, artifact, train, assignment, held_out, audit_config,
                                      seed=derive_seed(split_seed, "teachers"), thresholds=thresholds)
        out["teacher_reference"] = public_summary(reference)
        _write_audit_rows(artifact, key, reference, "teacher", out["teacher_reference"])
        results.append(reference)
    scores = [r.mia_scores.assign(artifact=artifact.name if r is result else "teacher") for r in results]
    _merge_rows(_private_folder(artifact) / f"mia_scores_{method}.parquet", pd.concat(scores, ignore_index=True),
                artifact.name)
    reseal(artifact)
    return out


def _audit_pools(artifact: Artifact):
    """(the private split, the members: the records the mechanism read (`ReleaseSpec.members`), the non-members:
    held-out records and the private records it never read, the teacher assignment or None), from the run's
    private store."""
    private = _private_folder(artifact)
    records_path = private / "records.parquet"
    assignment_path = private / "teacher_assignments.parquet"
    read = artifact.spec.members
    for needed in [records_path] + ([assignment_path] if read == "teachers" else []):
        if not needed.exists():
            raise ConfigError(f"run {artifact.run_id}: {needed} is missing (the audit needs the run's private "
                              "records)")
    records = read_table(records_path)
    train = records[records["split"] == "train"][["id", "text", "label"]].reset_index(drop=True)
    assignment = read_table(assignment_path) if read == "teachers" else None
    if assignment is not None:
        read_ids = assignment["id"].astype(str).tolist()
    elif read == "every-record":  # every training record could be sampled (q > 0)
        read_ids = train["id"].astype(str).tolist()
    else:
        read_ids = _sampled_ids(private, artifact)
    members = gate.audit_members(artifact, train, read_ids)
    unread = train[~train["id"].astype(str).isin(set(members["id"].astype(str)))]
    # never-read rows drawn like the members: the private file's rows held out for the audit (a run with a
    # separate test file), else the test split held out of it
    split = "audit" if (records["split"] == "audit").any() else "test"
    held_out = pd.concat([records[records["split"] == split][["id", "text", "label"]], unread], ignore_index=True)
    return train, members, held_out, assignment


POOL_BOUND_FAILURE = 1e-6  # the probability that the sampling drew fewer records than a pool's lower bound


def _public_pool_sizes(artifact: Artifact, train, members, held_out) -> tuple[int, int]:
    """The pool sizes the audit is designed from, said and published: functions of public counts. When the
    members are a Poisson draw (`Artifact.drawn_records`: PromptDPSGD's batches), how many it drew is a non-DP
    statistic of the sampling (it reveals the batch sizes). Each of the N records is drawn at least once with probability p = 1 - (1 - q)^T,
    independently, so the number drawn is Binomial(N, p): the design reads its lower POOL_BOUND_FAILURE
    quantile for the members and N minus its upper one for the unread records, public numbers the realised
    pools fall below only in a one-in-a-million draw (then the audit is refused, `audit_artifact`)."""
    if artifact.drawn_records is None:
        return len(members), len(held_out)
    from scipy.stats import binom

    q, steps = artifact.drawn_records
    n = len(train)
    p = 1.0 - (1.0 - q) ** steps
    drawn_low = int(binom.ppf(POOL_BOUND_FAILURE, n, p))
    drawn_high = int(binom.isf(POOL_BOUND_FAILURE, n, p))
    return drawn_low, len(held_out) + len(members) - drawn_high


def _reused_audit(artifact: Artifact, key: str, teacher_reference: bool) -> dict | None:
    """The public summaries of an audit of this artifact under the same configuration (`key`), or None."""
    audit_path = artifact.path / artifact.spec.audit_file
    teacher_path = artifact.path / TEACHER_AUDIT_FILE
    done = read_table(audit_path) if audit_path.exists() else None
    if done is None or not ((done["artifact"] == artifact.name) & (done["audit_config"] == key)).any():
        return None
    if teacher_reference and not teacher_path.exists():
        return None
    row = done[(done["artifact"] == artifact.name) & (done["audit_config"] == key)].iloc[-1]
    out = {"artifact": artifact.name, "reused": True, "audit": json.loads(row["summary"])}
    if teacher_reference:
        out["teacher_reference"] = json.loads(read_table(teacher_path).iloc[-1]["summary"])
    return out


def _write_audit_rows(artifact: Artifact, key: str, result, name: str, summary: dict) -> None:
    """An audit's rows: its figures (AUCs, intervals, overlap) to the private store, its verdict to the public
    table. `name`: the artifact's name, or "teacher" for the single-teacher contrast (its own files)."""
    tags = dict(artifact=name, method=artifact.method, audit_config=key, summary=json.dumps(summary))
    private = _private_folder(artifact)
    if name == "teacher":
        write_table(result.audit_frame().assign(**tags), private / TEACHER_AUDIT_FILE)
        write_table(result.public_frame().assign(**tags), artifact.path / TEACHER_AUDIT_FILE)
        return
    audit_file = artifact.spec.audit_file
    _merge_rows(private / audit_file, result.audit_frame().assign(**tags), artifact.name)
    _merge_rows(artifact.path / audit_file, result.public_frame().assign(**tags), artifact.name)


def _teacher_contrast(lm, spec, artifact: Artifact, train, assignment, held_out, audit_config, *, seed: int,
                      thresholds):
    """The non-private contrast: single PromptPATE teachers' prompts (real records), charged as an infinite
    spend before any teacher prompt is built."""
    from dpcore.audit import procedures as mia

    _charge_real_records(artifact)
    reference = mia.teacher_audit(lm, spec, teacher_prompts(train, assignment), held_out, audit_config,
                                  seed=seed, delta=artifact.delta, thresholds=thresholds,
                                  progress=lambda done, total: report_progress("audit single teachers", done, total),
                                  should_stop=stop_requested)
    get_run_logger().info("non-private contrast (single teachers' prompts): %s", mia.verdict_word(
        reference.passed, reference.reasons))
    return reference


def _charge_real_records(artifact: Artifact) -> dict:
    """The single-teacher contrast's infinite spend (real records in prompts), one transaction, under the run id."""
    from dpcore.config import RunConfig

    config = RunConfig(dataset=str(artifact.info.get("dataset") or artifact.dataset_id), dataset_id=artifact.dataset_id)
    request = real_records_spend(config, str(artifact.info["data_hash"]), artifact.run_id, artifact.delta)
    return charge_spends(artifact.dataset_id, [(AUDIT_REFERENCE, math.inf, request)])
