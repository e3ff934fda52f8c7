"""One run's whole configuration.

`RunConfig` is the single source: the CLI builds its flags from its fields
(`--num-subsets` for `num_subsets`), the Prefect flow takes it as its parameter,
`prefect.yaml` sets its fields, and MLflow logs `RunConfig.flat()` as params.
The smaller configs (`GenerationConfig`, `EvalConfig`, `AuditConfig`) are typed
views of it that dpcore functions take, so each function sees only what it uses.

Symbols of Tang et al. (Algorithm 1): M = num_subsets, N = subset_size,
K = top_k, RVP = rvp, T_max = max_tokens, sigma = noise multiplier. `max_record_tokens` is
the public token cap applied to every private record before generation (`dpcore.data.records`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dpcore.data.taskspec import load_task_spec, shipped_task_names
from dpcore.errors import ConfigError
from dpcore.names import (
    DEFAULT_BASELINES,
    METHODS,
    AuditMode,
    AuditTest,
    Baseline,
    Mechanism,
    Method,
    PateAccounting,
    PateBaseline,
    PatePublic,
    PateVoteMode,
    PromptInit,
    Sampler,
    TuneKind,
    method_name,
)

# A run's test items when --test-size is not given (`RunConfig.for_test_split`): one standard error of an
# accuracy is then about 5 points, and the evaluation a minute or two on 2 CPU cores.
DEFAULT_TEST_ITEMS = 100

# Command-line spellings that differ from `--field-name` (a switch that is on by default names its negation).
FLAG_SPELLINGS = {"rvp": "--no-rvp"}


def cli_flag(field: str) -> str:
    """The command-line flag of a `RunConfig` field: `pate_queries` -> `--pate-queries`."""
    return FLAG_SPELLINGS.get(field, "--" + field.replace("_", "-"))


def flag(field: str, value=None) -> str:
    """How a message names a `RunConfig` field: the flag a person types on the command line, then the
    field a YAML configuration (prefect.yaml, a deployment's parameters) sets, since either may have set
    it: `--pate-queries (pate_queries)`; with a value, `--pate-public ood (pate_public: ood)`.
    A name that is no `RunConfig` field is returned as it is."""
    if field not in RunConfig.model_fields:
        return field if value is None else f"{field} {value}"
    if value is None:
        return f"{cli_flag(field)} ({field})"
    return f"{cli_flag(field)} {value} ({field}: {value})"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GenerationConfig(_Frozen):
    """Parameters of Algorithm 1 for one generation call."""

    num_subsets: int = Field(10, ge=1, description="M: disjoint groups of private records per token step")
    subset_size: int = Field(2, ge=1, description="N: expected records per group (MN/|D_y| is the sampling rate)")
    top_k: int = Field(100, ge=1, description="K: public top-K vocabulary kept when RVP is on")
    rvp: bool = Field(True, description="Reduce vocabulary publicly (Algorithm 1 lines 7-10)")
    max_tokens: int = Field(40, ge=1, description="T_max: token steps per demonstration")
    mechanism: Mechanism = "gaussian"
    sampler: Sampler = Field(
        "poisson",
        description="poisson: the sampler the accountant models. fixed: the paper's code "
        "(MN records without replacement), bounded by the same accountant under add/remove "
        "neighbours (proof in dpcore.fewshot.sampling).",
    )
    demos_per_label: int = Field(1, ge=1, description="synthetic demonstrations generated per label")
    max_record_tokens: int | None = Field(
        None, ge=1,
        description="public cap: every private record is cut to this many tokens before generation; "
        "default: the largest cap for which the instruction, N records and max_tokens fit the model's context",
    )


class EvalConfig(_Frozen):
    shots: int = Field(4, ge=0, description="demonstrations in each ICL prompt")
    seeds: int = Field(5, ge=1, description="evaluation seeds (demo choice and order)")
    test_size: int | None = Field(None, ge=1, description="test items; default: the whole test split")
    calibrate: bool = True


class AuditConfig(_Frozen):
    enabled: bool = True
    trials: int = Field(20, ge=1, description="trials per demo set (DP audit) or in total (non-private audit)")
    demo_sets: int = Field(3, ge=1, description="independently generated DP demo sets")
    members: int = Field(50, ge=1)
    non_members: int = Field(50, ge=1)
    test: AuditTest = Field("detect", description="detect: the gate fails when an attack's interval of the AUC "
                            "excludes 0.5, sized to detect a leak of leak_auc with probability power; equivalence: "
                            "it passes only when every interval lies inside 0.5 +/- auc_tolerance")
    leak_auc: float = Field(0.75, gt=0.5, lt=1, description="detect: the leak (mean per-trial AUC) the audit is "
                            "sized to detect")
    power: float = Field(0.95, gt=0, lt=1, description="detect: the probability of detecting a leak of leak_auc")
    auc_tolerance: float = Field(0.05, gt=0, lt=0.5, description="equivalence: |AUC - 0.5| must stay within this")
    overlap_threshold: int = Field(8, ge=1, description="gate: verbatim token overlap that counts as a leak")
    confidence: float = Field(0.95, gt=0, lt=1)
    reference_prompts: int = Field(0, ge=0, description="OUT prompts (1-shot prompts of non-candidate records) "
                                   "of the offline LiRA attacks, each one more forward pass per record; fewer than "
                                   "2 (the default): the three calibrated attacks only, no LiRA")
    max_record_tokens: int | None = Field(None, ge=1, description="score each candidate's first N tokens only "
                                          "(a public cap that makes a time-boxed audit cheaper); None: whole text")
    mode: AuditMode = Field("run-demos", description="run-demos: the run's own demos vs held-out records (nothing "
                            "charged); regenerate: DP demos generated from half the private records (Tang et al. "
                            "App. F, charged)")


class RunConfig(_Frozen):
    """Everything one pipeline run needs. Field names are the CLI flag names."""

    methods: list[Method] = Field(
        default_factory=lambda: ["tang"],
        description="comma-separated private-prompting methods, run on the same data, test split and ledger: "
        "tang (DP few-shot generation), pate (PromptPATE), dpsgd (PromptDPSGD soft prompts), adadpsyn (AdaDPSyn's "
        "DP demonstrations), dp-opt (DP-OPT's private instruction), dp-icl (DP-ICL's private answers to the test "
        "items)")
    dataset: str = Field("agnews", description="a shipped task (agnews, trec, sst2, ...) or your task's name")
    data_path: str | None = Field(None, description="a user's CSV/JSONL/Parquet file (with --task-spec)")
    test_path: str | None = Field(
        None, description="a separate test file (same columns as the data file): the test split, instead of "
        "holding test rows out of the private file")
    task_spec: str | None = Field(None, description="path of a task YAML for a user dataset (kept resolved: a run "
                                  "reads the same file from any working directory)")
    dataset_id: str | None = Field(None, description="ledger identity; default: the dataset name (with "
                                   "--task-spec and no --dataset: the task spec's name)")
    new_budget_for_same_records: bool = Field(
        False, description="charge even when another dataset id already spends privacy on (largely) these "
        "records: a separate budget for the same records, knowingly (default: refused)")
    model: str = Field("smollm2-135m", description="the embedded model, a local model folder or a hub id")
    device: str = Field("auto", description="cpu, cuda or auto (CUDA when available)")
    dtype: str = Field("auto", description="float32, bfloat16, float16 or auto (bf16 on GPU, fp32 on CPU)")

    # The defaults of a run are sized so that a user's loop (set a budget, run, release, predict) on a file of
    # about 2,000 records closes in under 10 minutes on 2 CPU cores (benchmarks/RESULTS.md, "The own-data
    # loop"): one epsilon, 20-token demos from 5 groups of 1 record, 2 seeds on 100 test items, one audit demo
    # set. Larger sizes (M 10, N 2, T_max 40, several epsilons, 5 seeds: the earlier defaults) are flags.
    epsilons: list[float] = Field(default_factory=lambda: [4.0],
                                  description="comma-separated target epsilons; 0 = instruction-only demos")
    delta: float | None = Field(None, gt=0, lt=1, description="default: 1/|D_priv|")
    mechanism: Mechanism = Field("gaussian", description="per-token aggregation: Gaussian noise, or report-noisy-max")
    sampler: Sampler = Field("poisson", description="record sampler: poisson (what the accountant assumes) or fixed")
    num_subsets: int = Field(5, ge=1, description="M: disjoint groups of private records per token step")
    subset_size: int = Field(1, ge=1, description="N: expected records per group (q = MN/|D_y|)")
    top_k: int = Field(100, ge=1, description="K: public top-K vocabulary kept by RVP")
    rvp: bool = True
    max_tokens: int = Field(20, ge=1, description="T_max: token steps per demonstration")
    max_record_tokens: int | None = Field(
        None, ge=1, description="public token cap on each private record (default: the largest that fits the "
        "model's context with N records and max_tokens)")
    seed: int | None = Field(None, description="noise seed for experiments; None: cryptographically seeded")

    shots: int = Field(4, ge=0, description="demonstrations in each ICL prompt (generation makes ceil(shots/labels) per label)")
    seeds: int = Field(2, ge=1, description="evaluation seeds (choice and order of demos); accuracy is mean +/- std")
    test_size: int | None = Field(None, ge=1, description=f"test items evaluated (default: {DEFAULT_TEST_ITEMS}, or "
                                  "the whole test split when it is smaller; a size beyond the split is an error)")
    calibrate: bool = Field(True, description="contextual calibration of label probabilities (Zhao et al. 2021)")
    baselines: list[Baseline] = Field(
        default_factory=lambda: list(DEFAULT_BASELINES),
        description="comparison rows (default zero-shot; instruction-only, Tang et al.'s epsilon-0 demos, "
        "reads no record either); sigma-zero and random-real are "
        "non-private: opt-in, each charged to the ledger as an infinite spend")

    audit: bool = Field(True, description="run the membership-inference audit (Duan et al.) on the DP demos")
    audit_trials: int = Field(20, ge=1, description="audit trials per demo set")
    audit_demo_sets: int = Field(1, ge=1, description="DP demo sets a regenerate-mode audit generates from its "
                                 "members, each charged")
    audit_members: int = Field(50, ge=1, description="member (and as many non-member) records per audit trial")
    audit_mode: AuditMode | None = Field(None, description="run-demos: the run's own demos, training vs held-out "
                                         "test rows, nothing charged; regenerate: DP demos from a member half, scored "
                                         "against the other half, charged (default: run-demos; regenerate with "
                                         "--test-path, whose rows need not share the private file's distribution)")
    audit_test: AuditTest = Field("detect", description="detect: the audit gate fails when an attack distinguishes "
                                  "members from non-members, sized by --leak-auc and --audit-power; equivalence: it "
                                  "passes only when every AUC interval lies inside 0.5 +/- --auc-tolerance (about "
                                  "1,460 records per side at 0.05)")
    leak_auc: float = Field(0.75, gt=0.5, lt=1, description="audit (detect): the leak, a mean per-trial AUC, that the "
                            "audit is sized to detect")
    audit_power: float = Field(0.95, gt=0, lt=1, description="audit (detect): the probability of detecting a leak of "
                               "--leak-auc")
    audit_reference: bool = Field(False, description="also run the non-private reference audit (real records as "
                                  "1-shot demos, Duan et al.'s leaky setting) for contrast: an infinite spend, "
                                  "charged to the ledger")
    audit_methods: bool = Field(True, description="with audit on, also the release audit of PromptPATE's chosen "
                                "student and each PromptDPSGD prompt (nothing generated or charged; `dpicl release "
                                "--audit-only` runs it later)")
    audit_reference_prompts: int = Field(0, ge=0, description="R >= 2 adds the offline LiRA attacks against R "
                                         "OUT prompts built from non-members (R more forward passes per record); "
                                         "default 0: the three calibrated attacks")
    audit_max_record_tokens: int | None = Field(None, ge=1, description="score only each record's first tokens "
                                                "(default: whole records)")
    auc_tolerance: float = Field(0.05, gt=0, lt=0.5, description="audit gate (--audit-test equivalence): |AUC - 0.5| "
                                 "must stay within this")
    overlap_threshold: int = Field(8, ge=1, description="audit gate: verbatim token overlap that counts as a leak")

    # --- PromptPATE (Duan et al. Section 4.2, App. C.2): fields named pate_*
    pate_preset: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="defaults of the unset pate_* fields (teachers, queries, sigma1, sigma2, student "
        "candidates): gpu = Duan et al. Table 7 (E 200, Q 500, sigma2 20), cpu = minutes on the embedded model "
        "(E 20, Q 50, sigma1 = sigma2 = 10); auto: by device")
    pate_teachers: int | None = Field(None, ge=1, description="E: teacher prompts, built from disjoint private "
                                      "records (default: the preset's, 200 on GPU, 20 on CPU)")
    pate_shots: int = Field(1, ge=1, description="k: demonstrations per teacher prompt (and per student prompt)")
    pate_public: PatePublic = Field("iid", description="public queries: iid (the task's public split), ood (the "
                                    "task YAML's pate.ood_public dataset) or file (pate_public_path)")
    pate_public_path: str | None = Field(None, description="a CSV/JSONL/Parquet file of public queries (text column "
                                         "only); implies pate_public file")
    pate_public_column: str = Field("text", description="the text column of pate_public_path")
    pate_queries: int | None = Field(None, ge=1, description="Q: public queries each repeat may label, at most; "
                                     "the plan labels as many as the epsilon affords (default: the preset's, 500 "
                                     "on GPU, 50 on CPU)")
    pate_threshold: float | None = Field(None, description="T: Confident-GNMax threshold on the top vote count "
                                         "(default round(0.9 E): Table 7's 180 at E = 200)")
    pate_sigma1: float | None = Field(None, description="threshold noise std (default: the CPU preset's 10; on "
                                      "GPU the task YAML's, Table 7: 1, 5 for AG News)")
    pate_sigma2: float | None = Field(None, description="GNMax noise std on the vote counts (default: the preset's, "
                                      "Table 7's 20 on GPU, 10 on CPU)")
    pate_vote_mode: PateVoteMode = Field("calibrated", description="calibrated (argmax of calibrated label "
                                         "probabilities) or black-box (greedy next token; other tokens vote 'other')")
    pate_target_epsilon: float | None = Field(None, gt=0, description="PromptPATE's epsilon (all repeats together, "
                                              "data-independent): labelling stops before it would be exceeded "
                                              "(default: the largest epsilon of epsilons; inf: every query "
                                              "asked, charged at its data-independent bound)")
    pate_accounting: PateAccounting = Field(
        "data-independent", description="how the labelling is charged: data-independent (its bound for any votes, "
        "charged before any teacher votes: the default) or data-dependent (Papernot et al. 2018: the "
        "smooth-sensitivity release of an upper bound on the labelling's data-dependent cost, which fails with "
        "probability delta0 added to delta, is charged before any teacher votes, the released bound after the "
        "labelling and before any label is published; over the epsilon asked, nothing is published)")
    pate_gnss_order: float | None = Field(None, gt=1, description="data-dependent: the Renyi order of the release "
                                          "(default: the largest of 2-64 where the analysis applies at sigma2)")
    pate_gnss_beta: float | None = Field(None, gt=0, description="data-dependent: the smoothness beta (default "
                                         "0.4 / order, lowered so the bound's noise is at most twice sigma_ss)")
    pate_gnss_sigma: float = Field(10.0, gt=0, description="data-dependent: sigma_ss, the release's noise scale")
    pate_gnss_delta0: float | None = Field(None, gt=0, lt=1, description="data-dependent: the probability that "
                                           "the released upper bound falls below the labelling's data-dependent "
                                           "cost, part of delta (default: half the run's delta)")
    pate_repeats: int = Field(3, ge=1, description="noisy labellings and student choices (fresh noise each); "
                              "accuracy is mean +/- std over them, each charged")
    pate_student_candidates: int | None = Field(None, ge=1, description="candidate student prompts evaluated on "
                                                "the public validation queries (default: the preset's, 50 on GPU, "
                                                "10 on CPU)")
    pate_baselines: list[PateBaseline] = Field(
        default_factory=lambda: ["zero-shot"],
        description="comparison rows: zero-shot; ensemble (the flock's vote on the test split) and upper-bound (the "
        "best single teacher on the test split) are non-private: opt-in, charged as an infinite spend")
    pate_teacher_block: int = Field(25, ge=1, description="teachers per mapped flock-scoring task")

    # --- PromptDPSGD (Duan et al. Section 4.1, App. C.1): fields named dpsgd_*
    dpsgd_kind: TuneKind = Field(
        "soft-prompt", description="what trains: soft-prompt (s input embeddings) or prefix (keys and values at "
        "every layer, P-tuning v2); the DP fine-tuning baselines lora (rank-r adapters on q_proj/v_proj) or full "
        "(every weight)")
    dpsgd_preset: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="defaults of the unset dpsgd_* fields: gpu = Duan et al. Table 6 (C 0.1, batch 1024, "
        "length 10, 100 epochs, lr 0.005), cpu = minutes on the embedded model; auto: by device")
    dpsgd_length: int | None = Field(None, ge=1, description="s: prompt positions (default: the preset's, 10)")
    dpsgd_rank: int | None = Field(None, description="LoRA rank r for --kind lora (default 8)")
    dpsgd_init: PromptInit | None = Field(
        None, description="P_0: embeddings of random vocabulary tokens (vocab), random, or the embeddings of the "
        "task's instruction tokens (instruction); default: the preset's (instruction on CPU, vocab on GPU)")
    dpsgd_clip: float | None = Field(None, gt=0, description="C: per-example gradient norm bound (default: 0.1)")
    dpsgd_batch_size: int | None = Field(None, ge=1, description="expected Poisson batch size qN (default: "
                                         "the preset's)")
    dpsgd_epochs: float | None = Field(None, gt=0, description="epochs: T = epochs / q steps (default: the "
                                       "preset's)")
    dpsgd_steps: int | None = Field(None, ge=1, description="T directly (overrides dpsgd_epochs)")
    dpsgd_lr: float | None = Field(None, gt=0, description="learning rate (AdamW, linear decay to 0)")
    dpsgd_physical_batch_size: int | None = Field(None, ge=1, description="examples per forward/backward "
                                                  "(memory only; default: the preset's)")
    dpsgd_validation_size: int | None = Field(None, ge=0, description="public labelled examples for the loss "
                                              "curve (never private records; default: the preset's, 64 on CPU, "
                                              "500 on GPU)")
    dpsgd_validation_path: str | None = Field(None, description="a labelled file you declare public (the data "
                                              "file's columns) for the loss curve of your own data; a shipped "
                                              "task uses its public split; without either, no curve")
    dpsgd_seeds: int = Field(1, ge=1, description="independent trainings (accuracy mean +/- std over them); "
                             "each is charged to the ledger")

    # --- AdaDPSyn (Gao et al. 2024): fields named adadpsyn_*. M, N, K, RVP and T_max are the run's (Algorithm 1's);
    # sigma_avg is calibrated to each epsilon; the rest are PFIRR's public parameters, the paper's by default
    # (`dpcore.adadpsyn.params.PAPER`), never tuned on private data.
    adadpsyn_sigma_radius: float = Field(15.0, gt=0, description="AdaDPSyn: noise multiplier of the radius "
                                         "search's queries (std 2 sigma_radius on L(r)); the paper's 15")
    adadpsyn_sigma_test: float = Field(5.0, gt=0, description="AdaDPSyn: noise multiplier of each coverage test "
                                       "(std sigma_test on a count); the paper's 5")
    adadpsyn_tolerance: float = Field(0.1, gt=0, lt=0.7071, description="AdaDPSyn: the radius search stops at this "
                                      "bracket width; the paper's 0.1")
    adadpsyn_coverage: float = Field(0.8, gt=0, le=1, description="AdaDPSyn: share t of the M groups the radius "
                                     "covers; the paper's 0.8")
    adadpsyn_shrink: float = Field(0.25, ge=0, description="AdaDPSyn: lambda, the last noise the next radius allows "
                                   "for; the paper's 0.25")
    adadpsyn_test_fraction: float = Field(0.55, ge=0, le=1, description="AdaDPSyn: mu_test, the share of groups a "
                                          "smaller ball must hold; the paper's 0.55")
    adadpsyn_updates: int = Field(2, ge=0, description="AdaDPSyn: T_update, radius reductions per token at most; "
                                  "the paper's 2")

    # --- DP-OPT (Hong et al. 2024): fields named dp_opt_*; unset ones from the preset
    # (`dpcore.dp_opt.presets`: gpu = the paper's PAPER, cpu = SMOKE, seconds on a CPU).
    dp_opt_preset: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="DP-OPT: defaults of the unset dp_opt_* fields: gpu = Hong et al. (205 subsets of 5, "
        "40 candidates of 50 tokens), cpu = a CPU size (8 subsets of 2, 2 candidates of 6 tokens, a 1% "
        "holdout); auto: by device")
    dp_opt_subsets: int | None = Field(None, ge=1, description="DP-OPT: M, demo subsets voting on each token")
    dp_opt_shots: int | None = Field(None, ge=1, description="DP-OPT: k, demonstrations per subset")
    dp_opt_max_tokens: int | None = Field(None, ge=1, description="DP-OPT: T, tokens per candidate instruction")
    dp_opt_candidates: int | None = Field(None, ge=1, description="DP-OPT: J, candidate instructions (J > 1: one "
                                          "chosen privately on a keyed-hash holdout)")
    dp_opt_temperature: float | None = Field(None, ge=0, description="DP-OPT: each subset's sampling temperature "
                                             "(0: its argmax; the paper's 1.1)")

    # --- DP-ICL (Wu et al. 2024): fields named dp_icl_*; unset ones from the paper's ensemble
    # (`dpcore.dp_icl.presets`). In a run it answers the run's test items (Q = --test-size) at each finite
    # epsilon > 0, its noise calibrated to answer all Q within that epsilon (`tasks.dp_icl.plans`).
    dp_icl_subsets: int | None = Field(None, ge=1, description="DP-ICL: M, disjoint exemplar subsets voting on each "
                                       "test item (default: the paper's 10)")
    dp_icl_shots: int | None = Field(None, ge=1, description="DP-ICL: k, most records in one subset's prompt "
                                     "(default: the paper's 4)")
    dp_icl_queries_per_draw: int | None = Field(None, ge=1, description="DP-ICL: B, test items sharing one draw of "
                                                "subsets (default: 1, the paper's)")
    dp_icl_vote_mode: Literal["calibrated", "black-box"] | None = Field(
        None, description="DP-ICL: each subset's vote, its calibrated label probabilities or its greedy token "
        "(default: calibrated, the paper's)")

    task_runner: str = Field("threads", description="threads, dask (a local cluster) or a Dask scheduler address")

    @model_validator(mode="before")
    @classmethod
    def _dataset_from_task_spec(cls, values):
        """A user dataset's identity comes from its task spec, never from the default dataset name:
        with `task_spec` and no `dataset`, `dataset` is the spec's `name`."""
        if isinstance(values, dict) and values.get("task_spec") and not values.get("dataset"):
            values = {**values, "dataset": load_task_spec(values["task_spec"]).name}
        return values

    @field_validator("task_spec")
    @classmethod
    def _resolve_task_spec(cls, value: str | None) -> str | None:
        """A task YAML's path made absolute, so what a run keeps (its manifest, its release) names the same file
        from any working directory; a shipped task's name (no suffix) stays a name."""
        if value is None or not Path(value).suffix:
            return value
        return str(Path(value).expanduser().resolve())

    @field_validator("task_runner")
    @classmethod
    def _check_task_runner(cls, value: str) -> str:
        return check_task_runner(value)

    @field_validator("epsilons", mode="before")
    @classmethod
    def _parse_epsilons(cls, value):
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        return [float(v) for v in value]

    @field_validator("epsilons")
    @classmethod
    def _check_epsilons(cls, value: list[float]) -> list[float]:
        for eps in value:
            if math.isnan(eps) or eps < 0:
                raise ValueError(f"epsilons: {eps} is not a valid epsilon (use a number >= 0, or inf)")
        return value

    @field_validator("methods", "baselines", "pate_baselines", mode="before")
    @classmethod
    def _parse_names(cls, value):
        """A comma-separated flag (`--methods tang,pate`) as its list of names."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return [method_name(v) for v in value] if isinstance(value, list) else value  # dp: tang's old name

    @field_validator("methods")
    @classmethod
    def _check_methods(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("methods: name at least one of " + ", ".join(METHODS))
        if len(set(value)) != len(value):
            raise ValueError(f"methods: {','.join(value)} names a method twice")
        return value

    @model_validator(mode="before")
    @classmethod
    def _public_path_means_file(cls, values):
        """A public file given means the file source."""
        if isinstance(values, dict) and values.get("pate_public_path") and not values.get("pate_public"):
            values = {**values, "pate_public": "file"}
        return values

    @model_validator(mode="after")
    def _check_pate_public(self) -> RunConfig:
        if self.pate_public_path and self.pate_public != "file":
            raise ValueError(f"{flag('pate_public_path')} is a public file, but {flag('pate_public')} is "
                             f"{self.pate_public!r}: give one of them")
        return self

    @model_validator(mode="after")
    def _check_sources(self) -> RunConfig:
        if self.data_path and not self.task_spec and self.dataset not in _EMBEDDED_SPEC_NAMES():
            raise ValueError(f"{flag('data_path')} needs {flag('task_spec')} (a task YAML) unless {flag('dataset')} "
                             "names a shipped task")
        if self.shots == 0 and any(eps > 0 for eps in self.epsilons):
            raise ValueError(
                "shots 0: ICL prompts hold no demonstrations, so there is nothing to generate and no privacy to "
                "spend; use --shots >= 1 for DP demonstrations, or --epsilons 0 (instruction-only, no private data) "
                "to evaluate without them")
        return self

    @property
    def ledger_id(self) -> str:
        return self.dataset_id or self.dataset

    def _section(self, section: type[_Frozen], prefix: str = "", **fields):
        """The part of this run that `section` configures: each of its fields from the run's field of the
        same name, `prefix`ed where the run has that spelling (`audit_trials` -> `trials`)."""
        own = type(self).model_fields
        for name in section.model_fields:
            source = prefix + name if prefix + name in own else name
            if name not in fields and source in own:
                fields[name] = getattr(self, source)
        return section(**fields)

    def generation_config(self) -> GenerationConfig:
        return self._section(GenerationConfig)

    def eval_config(self) -> EvalConfig:
        return self._section(EvalConfig)

    def for_test_split(self, num_test: int) -> RunConfig:
        """This configuration on a test split of `num_test` items: an unset `test_size` becomes
        `DEFAULT_TEST_ITEMS`, or the whole split when it is smaller (a public count); a set one stays."""
        if self.test_size is not None:
            return self
        return self.model_copy(update={"test_size": min(DEFAULT_TEST_ITEMS, num_test) or None})

    def audit_config(self) -> AuditConfig:
        return self._section(AuditConfig, "audit_", enabled=self.audit, non_members=self.audit_members,
                             mode=self.resolved_audit_mode)

    @property
    def resolved_audit_mode(self) -> AuditMode:
        """--audit-mode as set; unset, run-demos (the run's own demos against held-out rows: no extra charge),
        except with --test-path: rows from another file need not share the private records' distribution, and
        the audit's false-alarm rate holds only for non-members drawn like the members (regenerate: half the
        private split)."""
        if self.audit_mode is not None:
            return self.audit_mode
        return "regenerate" if self.test_path is not None else "run-demos"

    def flat(self) -> dict[str, str]:
        """Strings for MLflow params and manifests (public configuration only)."""
        out = {}
        for key, value in self.model_dump().items():
            out[key] = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        return out


def check_task_runner(spec: str | None) -> str:
    """`threads` | `threads:N` | `dask` | `dask:N` | a Dask scheduler address (`tcp://host:8786`, `host:8786`);
    anything else is a configuration error, raised before a run charges the ledger."""
    text = (spec or "threads").strip()
    head, sep, tail = text.partition(":")
    if head in ("threads", "dask"):
        if not sep or (tail.isdigit() and int(tail) >= 1):
            return text
        raise ConfigError(f"{flag('task_runner')}: {text!r}: the worker count after {head}: must be an integer >= 1")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme in ("tcp", "tls", "inproc", "ucx", "ws", "wss") and rest:
            return text
    elif sep and head and tail.isdigit():
        return text
    raise ConfigError(f"{flag('task_runner')}: {text!r} is not threads, threads:N, dask, dask:N or a Dask scheduler address "
                     "(tcp://host:port)")


def demos_per_label(shots: int, num_labels: int) -> int:
    """Synthetic demos needed per label so an ICL prompt of `shots` demos can take one per chosen label."""
    return max(1, math.ceil(shots / max(1, num_labels)))


def _EMBEDDED_SPEC_NAMES() -> set[str]:
    return set(shipped_task_names())
