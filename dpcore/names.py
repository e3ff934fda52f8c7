"""The names every layer shares: private-prompting methods, noise mechanisms, samplers, demo sources,
baselines. Each is a `Literal` type (what a `RunConfig` field accepts) and the tuple of its values.

The ground floor of dpcore: it imports nothing of the package but the error types, so the ledger, the
plans, the mechanisms and the configuration can all name a method or a mechanism without importing each
other.
"""

from __future__ import annotations

from typing import Literal, get_args

from dpcore.errors import ConfigError

# The private-prompting methods dpicl runs on the same data, test split and ledger:
# tang = DP few-shot generation (Tang et al. Algorithm 1), pate = PromptPATE (Duan et al. Section 4.2),
# dpsgd = PromptDPSGD soft prompts (Duan et al. Section 4.1).
# adadpsyn = AdaDPSyn (Gao et al. 2024: Algorithm 1 with data-adaptive aggregation), dp-opt = DP-OPT (Hong et al.
# 2024: a private instruction), dp-icl = DP-ICL (Wu et al. 2024: private prediction, each answer a noisy vote of
# private exemplar subsets). Each is one entry of the method registry (`tasks.methods.REGISTRY`).
Method = Literal["tang", "pate", "dpsgd", "adadpsyn", "dp-opt", "dp-icl"]
METHODS: tuple[str, ...] = get_args(Method)
# Methods whose product is answers to queries, not a prompt (nothing to release or audit): in a run they answer the
# run's test items; they also have commands of their own (DP-ICL: `dpicl dp-icl`, `dpicl serve --private`).
PREDICTION_METHODS: tuple[str, ...] = ("dp-icl",)
# Earlier spellings, read as the current name and never written: tables and run folders from before DP few-shot
# generation was named tang everywhere say `dp` in their `method` column, and `--method dp` still works.
OLD_METHOD_NAMES = {"dp": "tang"}
# Noise mechanisms the accountant composes (`dpcore.privacy.composition.STEP_KINDS`).
Mechanism = Literal["gaussian", "rnm"]
MECHANISMS: tuple[str, ...] = get_args(Mechanism)
# How a label's records are subsampled into groups (`dpcore.fewshot.sampling`).
Sampler = Literal["poisson", "fixed"]
SAMPLERS: tuple[str, ...] = get_args(Sampler)
AuditMode = Literal["regenerate", "run-demos"]
# detect: the gate fails when an attack distinguishes members (interval excludes AUC 0.5), sized by power;
# equivalence: it passes only when every interval lies inside 0.5 +/- auc_tolerance
AuditTest = Literal["detect", "equivalence"]
# Where an evaluated prompt's demonstrations come from (the rows of Tang et al. Table 1):
# none, instruction-only (epsilon = 0), sigma = 0, real records, DP demonstrations (`tang`), a PromptPATE
# student (`pate`: public queries with noisy labels), (`dpsgd`) no demonstration but a trained
# PromptDPSGD prompt in front, AdaDPSyn's DP demonstrations (`adadpsyn`), or (`dp-opt`) no demonstration but
# DP-OPT's private instruction in front.
DemoSource = Literal["zero-shot", "instruction-only", "sigma-zero", "random-real", "tang", "pate", "dpsgd",
                     "adadpsyn", "dp-opt"]
DEMO_SOURCES: tuple[str, ...] = get_args(DemoSource)
# The demo sources run beside the DP demonstrations for comparison.
Baseline = Literal["zero-shot", "instruction-only", "sigma-zero", "random-real"]
PatePublic = Literal["iid", "ood", "file"]
PateVoteMode = Literal["calibrated", "black-box"]
# How PromptPATE's labelling is charged: its bound for any votes (the default), or Papernot et al. 2018's
# data-dependent cost released through smooth sensitivity (`dpcore.pate.released_cost.data_dependent_plan`).
PateAccounting = Literal["data-independent", "data-dependent"]
PateBaseline = Literal["zero-shot", "ensemble", "upper-bound"]
ALL_BASELINES: tuple[str, ...] = get_args(Baseline)
# The default comparison row: zero-shot, which reads no private record and which every run's verdict line is
# measured against. `instruction-only` (Tang et al.'s epsilon-0 demos: a generation and an evaluation more)
# reads none either: opt-in. `sigma-zero` (no noise) and `random-real` (real records as demonstrations) are
# non-private: opt-in only, charged as infinite spends.
DEFAULT_BASELINES: tuple[str, ...] = ("zero-shot",)
NON_PRIVATE_BASELINES: tuple[str, ...] = ("sigma-zero", "random-real")
# PromptDPSGD's trainable prompt (`dpcore.dpsgd.soft_prompt`): s input embeddings, or keys and values at every layer
# (P-tuning v2); P_0 from random vocabulary tokens' embeddings, or random.
# What may spend privacy (the ledger's `purpose`): each method's spends under its name, but DP few-shot
# generation's, charged before methods had names, under the flow's (pipeline) and the `generate` command's;
# audit: the audit's own DP generations; baseline: a non-private baseline.
_NAMED_PURPOSES = {"tang": ("pipeline", "generate")}


def ledger_purposes(method: str) -> tuple[str, ...]:
    """The ledger purposes method `method`'s spends are charged under."""
    return _NAMED_PURPOSES.get(method, (method,))


PURPOSES: tuple[str, ...] = (*(p for m in METHODS for p in ledger_purposes(m)), "audit", "baseline")
# Methods whose prompt is used with raw label scores (a trained prompt is fitted to the raw likelihood; chosen on
# public data); the others' prompts are used contextually calibrated (Zhao et al.).
RAW_SCORED_METHODS: tuple[str, ...] = ("dpsgd",)
PromptKind = Literal["soft-prompt", "prefix"]
PROMPT_KINDS: tuple[str, ...] = get_args(PromptKind)
# The DP fine-tuning baselines trained the same way (`dpcore.dpsgd.adapters`, Duan et al. Table 1): LoRA
# matrices beside the frozen weights, or every weight of the model.
AdapterKind = Literal["lora", "full"]
ADAPTER_KINDS: tuple[str, ...] = get_args(AdapterKind)
# What `dpicl tune --kind` trains: a prompt or an adapter.
TuneKind = Literal["soft-prompt", "prefix", "lora", "full"]
TUNE_KINDS: tuple[str, ...] = get_args(TuneKind)
PromptInit = Literal["vocab", "random", "instruction"]
PROMPT_INITS: tuple[str, ...] = get_args(PromptInit)


def check_mechanism(mechanism) -> str:
    """`mechanism` when it is one of `MECHANISMS`; otherwise a ConfigError naming them."""
    if mechanism not in MECHANISMS:
        raise ConfigError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    return mechanism


def method_name(name):
    """The current name of a method or demo source: an old spelling (`OLD_METHOD_NAMES`) read as today's."""
    return OLD_METHOD_NAMES.get(name, name) if isinstance(name, str) else name


def current_method_names(frame):
    """`frame` with its `method` column under current names (a table written before a rename), else as is."""
    if "method" not in frame.columns or not frame["method"].isin(list(OLD_METHOD_NAMES)).any():
        return frame
    return frame.assign(method=frame["method"].map(method_name))
