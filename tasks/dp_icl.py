"""DP-ICL as a product feature (Wu et al. 2024): plan a budget of queries, charge before answering, answer.

One `PrivateAnswerer` holds a DP-ICL run: the private records (in memory), the plan (`dpcore.dp_icl.privacy`),
the run's secret subset key (written to the run's private folder, mode 0600, never anywhere else), the noise
source and the index of the next query. `answer(texts)` is the one path to an answer, for `dpicl dp-icl` (one
batch: every planned query) and `dpicl serve --private` (a batch per request):

1. under the answerer's lock, the batch must lie within the plan's queries (else `BudgetSpentError`: nothing
   charged, nothing answered);
2. its spend (`dpcore.dp_icl.privacy.batch_spend`) is charged to the ledger (`tasks.charge.charge_spends`, the
   one charging path; fresh: every batch draws fresh noise), which refuses a batch over the dataset's budget
   (`BudgetExceededError`, nothing recorded);
3. only then are the queries indices taken and the batch answered (`dpcore.dp_icl.answer.answer_queries`).

The lock makes check, charge and answer one step per batch: two requests never both pass the check for the
same queries; the ledger's own charge is atomic across processes. Everything returned is public: the noisy
argmax labels (for an extraction task, the keywords a noisy majority of the subsets name: `dpcore.dp_icl.keywords`)
and the plan's public parameters.

In a run (`dpicl run --methods ...,dp-icl`, the method registry's protocol: `tasks.methods`, `flows.dp_icl`), DP-ICL
answers the run's test items, the items every other method is evaluated on, in the same order
(`dpcore.lm.icl.select_test`): `plans` sizes its plan at each finite epsilon > 0 to Q = the run's test size (the
noise calibrated so that the Q answers compose within the epsilon; refused, before any charge, with the flag to
change, when it cannot be), the plans join the run's one ledger charge, and `answer` (one task per epsilon,
under that charge) answers the Q items with a key and noise of its own, writing the answers and their accuracy
(DP outputs) to the public run folder; `result_rows` are its rows of the comparison (`RESULTS_FILE`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpcore.data.artifacts import write_json_atomic, write_table
from dpcore.data.datasets import LoadedDataset
from dpcore.data.taskspec import load_task_spec
from dpcore.display import fmt_delta, fmt_eps
from dpcore.dp_icl import presets as dp_icl_presets
from dpcore.dp_icl.answer import answer_queries
from dpcore.dp_icl.ensemble import ANSWER_TOKENS
from dpcore.dp_icl.privacy import METHOD, aggregation_for, batch_spend, dp_icl_plan, queries_within
from dpcore.dp_icl.subsets import check_count, run_key
from dpcore.errors import BudgetExceededError, ConfigError, DpiclError
from dpcore.fewshot.mechanisms import noise_generator
from dpcore.fewshot.plan import default_delta
from dpcore.lm import runtime
from dpcore.lm.icl import CONTENT_FREE_INPUTS, check_test_size, exact_match, select_test
from dpcore.pate.flock import VOTE_MODES
from dpcore.privacy.events import NoOpDpEvent
from dpcore.privacy.plan import PrivacyPlan
from dpcore.public_outputs import Kind, declare, declare_log
from tasks.charge import charge_spends, plan_spends
from tasks.common import (
    Ingested,
    derive_seed,
    language_model,
    report_progress,
    run_paths,
    stage_logger,
    uncached_task,
)
from tasks.kept import KeptStage, mark_if_charged

KEY_FILE = "dp_icl_key.bin"   # the run's secret subset key, in the run's private folder
PLAN_FILE = "dp_icl_plan.json"  # the plan's public parameters, in the run's public folder

# the answers are DP outputs (noisy argmax labels, or an extraction task's noisy-majority keywords) and so is
# accuracy over them; the plan's numbers are functions of public counts (|D|, M, k, Q, B, K, the budget)
declare("json:dp-icl", Kind.DP, "/answers", "/answers/**", "/accuracy", "/correct")
declare("json:dp-icl", Kind.COUNT, "/records", "/sampling_rate", "/noise_multiplier", "/noise_std",
        "/queries_affordable", "/draw_noise_multiplier", "/epsilon_composed", "/ledger/**")
declare("json:dp-icl", Kind.IDENTITY, "/run_id", "/data_hash")


class BudgetSpentError(BudgetExceededError):
    """A batch beyond the queries the run's budget affords: refused before anything is charged (exit 3)."""


@dataclass(frozen=True)
class Settings:
    """The ensemble (public, fixed from the paper's presets or the user's flags, never from the private data)."""

    preset: str
    subsets: int
    shots: int
    queries_per_draw: int
    vote_mode: str
    queries: int  # the preset's planned queries (used when the user names none)
    max_keywords: int  # K of an extraction task's keyword space aggregation


def device_type(device: str | None) -> str:
    """"cuda" or "cpu": what `--device` (auto: CUDA when torch sees a GPU) puts the model on (the preset's choice)."""
    if device not in (None, "auto"):
        return "cuda" if str(device).startswith("cuda") else "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def settings(preset: str = "auto", device_type: str = "cpu", *, subsets: int | None = None,
             shots: int | None = None, queries_per_draw: int | None = None,
             vote_mode: str | None = None, max_keywords: int | None = None) -> Settings:
    """The preset's values (`dpcore.dp_icl.presets`) with the given ones instead; each value checked."""
    if preset not in dp_icl_presets.PRESETS:
        raise ConfigError(f"--preset: {preset!r} is none of {', '.join(dp_icl_presets.PRESETS)}")
    name, values = dp_icl_presets.preset(preset, device_type)
    mode = vote_mode or values["vote_mode"]
    if mode not in VOTE_MODES:
        raise ConfigError(f"--vote-mode: must be one of {', '.join(VOTE_MODES)}, got {mode!r}")
    return Settings(name, check_count("--subsets", subsets or values["subsets"]),
                    check_count("--shots", shots or values["shots"]),
                    check_count("--queries-per-draw", queries_per_draw or values["queries_per_draw"]),
                    mode, int(values["queries"]),
                    check_count("--max-keywords", max_keywords or values["max_keywords"]))


@dataclass(frozen=True)
class Budget:
    """What the run may answer: its plan (covering `plan.parameters["queries"]` queries) and the queries the
    epsilon affords at the plan's noise (`queries_within`; the planned queries when no epsilon was given)."""

    plan: PrivacyPlan
    affordable: int
    epsilon: float | None           # the user's epsilon (None: the noise multiplier was given alone)

    @property
    def queries(self) -> int:
        return int(self.plan.parameters["queries"])

    def line(self) -> str:
        """The line said before anything is charged (public: parameters only)."""
        p = self.plan.parameters
        counted = (f"keyword count, K={p['max_keywords']} keywords per subset"
                   if p.get("aggregation") == "keywords" else "vote count")
        head = (f"DP-ICL: M={p['subsets']} subsets x k={p['shots']} shots on {p['records']} private records "
                f"(q={p['sampling_rate']:.4g}), noise multiplier {p['noise_multiplier']:.4g} "
                f"(std {p['noise_std']:.4g} per {counted})")
        if self.epsilon is None:
            return (f"{head}; {self.queries} queries planned cost epsilon {fmt_eps(self.plan.epsilon)} at delta "
                    f"{fmt_delta(self.plan.delta)}")
        return (f"{head}; epsilon {fmt_eps(self.epsilon)} at delta {fmt_delta(self.plan.delta)} affords "
                f"{self.affordable} queries; {self.queries} planned")


def plan_budget(records: int, delta: float, settings: Settings, *, epsilon: float | None = None,
                noise_multiplier: float | None = None, queries: int | None = None,
                limit: int | None = None, aggregation: str = "rnm") -> Budget:
    """The run's plan from public counts only.

    - epsilon and queries: sigma calibrated so that the queries compose within epsilon;
    - epsilon and noise multiplier: the plan covers the queries the epsilon affords (`queries_within`), at most
      `queries` when given (asking for more than it affords is refused, nothing charged);
    - noise multiplier and queries: the plan's epsilon is their composition.
    Queries not given: the preset's (or, with epsilon and noise multiplier, all the budget affords), at most
    `limit` (the queries there are to answer). `aggregation` ("rnm", or "keywords" for an extraction task at the
    settings' K) sets the noise std per count, never the accounting.
    A budget that affords no query is refused (`BudgetExceededError`, exit 3)."""
    if epsilon is not None:
        epsilon = float(epsilon)
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ConfigError(f"--epsilon: must be a finite number > 0, got {epsilon:g}")
    if noise_multiplier is not None and not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigError(f"--noise-multiplier: must be a finite number > 0, got {noise_multiplier:g}")
    if queries is not None:
        queries = check_count("--queries", queries)
    cap = math.inf if limit is None else check_count("queries to answer", limit)
    if epsilon is None and noise_multiplier is None:
        raise ConfigError("give --epsilon or --noise-multiplier (or both)")
    shape = dict(subsets=settings.subsets, shots=settings.shots, queries_per_draw=settings.queries_per_draw)
    release = dict(aggregation=aggregation, max_keywords=settings.max_keywords)
    if noise_multiplier is None:
        q = queries or min(settings.queries, cap)
        plan = dp_icl_plan(epsilon, delta, q, records, **shape, **release)
        sigma = float(plan.parameters["noise_multiplier"])
        return Budget(plan, queries_within(epsilon, delta, sigma, records, **shape), epsilon)
    if epsilon is None:
        q = queries or min(settings.queries, cap)
        plan = dp_icl_plan(None, delta, q, records, noise_multiplier=noise_multiplier, **shape, **release)
        return Budget(plan, q, None)
    affordable = queries_within(epsilon, delta, noise_multiplier, records, **shape)
    if affordable == 0:
        raise BudgetExceededError(f"epsilon {fmt_eps(epsilon)} at delta {fmt_delta(delta)} affords no DP-ICL query "
                                  f"at noise multiplier {noise_multiplier:g}: raise the noise or the epsilon")
    if queries is not None and queries > affordable:
        raise BudgetExceededError(f"--queries {queries}: epsilon {fmt_eps(epsilon)} at delta {fmt_delta(delta)} "
                                  f"affords {affordable} queries at noise multiplier {noise_multiplier:g}")
    plan = dp_icl_plan(None, delta, queries or min(affordable, cap), records, noise_multiplier=noise_multiplier,
                       **shape, **release)
    return Budget(plan, affordable, epsilon)


def test_queries(data: LoadedDataset) -> tuple[list[str], list[str]]:
    """The dataset's test items as queries (texts, gold labels), in the order `dpicl run` evaluates them (the seeded
    shuffle of `dpcore.lm.icl.select_test`): `--queries N` answers the same N items as `dpicl run --test-size N`,
    so DP-ICL's accuracy compares with every other method's on the same items."""
    items = select_test(data.test, None)
    return items["text"].astype(str).tolist(), items["label"].astype(str).tolist()


def run_delta(config, records: int) -> float:
    """The configuration's delta (the flag, or the budget's the CLI put in it), else 1/|D|."""
    return float(config.delta) if config.delta is not None else float(default_delta(records))


def write_key(private_folder: Path, key: bytes, name: str = KEY_FILE) -> Path:
    """The run's secret subset key in its private folder (mode 0600): nowhere else."""
    path = Path(private_folder) / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return path


class PrivateAnswerer:
    """A DP-ICL run answering batches of queries, each charged before it is answered (module docstring)."""

    def __init__(self, lm, data: LoadedDataset, budget: Budget, *, dataset_id: str, run_id: str, rng,
                 key: bytes, vote_mode: str = "calibrated", same_records_ok: bool = False, max_rows: int = 64):
        self.lm, self.data, self.budget = lm, data, budget
        self.dataset_id, self.run_id = dataset_id, run_id
        self.vote_mode, self.same_records_ok, self.max_rows = vote_mode, same_records_ok, max_rows
        self._rng, self._key = rng, key
        self._records = list(zip(data.train["text"], data.train["label"], data.train["id"].astype(str),
                                 strict=True))
        self._next = 0
        self._lock = threading.Lock()

    @property
    def answered(self) -> int:
        return self._next

    @property
    def remaining(self) -> int:
        return self.budget.queries - self._next

    def status(self) -> dict:
        """The public state: the plan's parameters, the budget's queries, those answered and those left."""
        return {"queries_affordable": self.budget.affordable, "queries_planned": self.budget.queries,
                "queries_answered": self._next, "queries_remaining": self.remaining,
                "epsilon": self.budget.plan.epsilon, "delta": self.budget.plan.delta,
                **{k: self.budget.plan.parameters[k] for k in PUBLIC_PARAMETERS}}

    def charge(self, first: int, count: int) -> dict:
        """Charge queries [first, first + count) (`batch_spend`) to the ledger; refused batches record nothing."""
        plan = self.budget.plan
        spend = batch_spend(plan, first, count)
        if isinstance(spend.event, NoOpDpEvent):  # inside a draw already charged (queries_per_draw > 1)
            return {"charged": 0}
        request = spend.bound(self.dataset_id, self.data.content_hash, self.run_id, plan.delta)
        return charge_spends(self.dataset_id, [(plan.method, plan.epsilon, request)], fresh=True,
                             same_records_ok=self.same_records_ok)

    def answer(self, texts: Sequence[str]) -> dict:
        """The noisy-argmax labels of `texts` (the run's next queries), charged first; refused when the plan's
        queries are spent (`BudgetSpentError`) or the ledger's budget cannot afford them (`BudgetExceededError`),
        nothing charged and nothing answered either way."""
        texts = [str(t) for t in texts]
        if not texts:
            raise ConfigError("no query to answer")
        with self._lock:
            first = self._next
            if first + len(texts) > self.budget.queries:
                raise BudgetSpentError(
                    f"DP-ICL budget spent: {self.remaining} of {self.budget.queries} queries left, "
                    f"{len(texts)} asked; nothing answered, nothing charged")
            charged = self.charge(first, len(texts))
            self._next = first + len(texts)
            answers = answer_queries(self.lm, self.data.spec, self._records, texts, self.budget.plan, self._key,
                                     self._rng, first_query=first, mode=self.vote_mode, max_rows=self.max_rows)
        return {"answers": list(answers.labels), "first_query": first,
                "ledger": {k: charged.get(k) for k in ("charged", "total_epsilon", "delta")},
                "queries_remaining": self.budget.queries - first - len(texts)}


PUBLIC_PARAMETERS = ("subsets", "shots", "records", "sampling_rate", "queries", "queries_per_draw", "draws",
                     "noise_multiplier", "draw_noise_multiplier", "noise_std", "aggregation", "max_keywords")


def is_correct(answer: str | None, gold: str, aggregation: str) -> bool:
    """A released answer scored against its gold label: an extraction answer by exact match after normalisation
    (`dpcore.lm.icl.exact_match`, the extraction evaluation's metric), a label by equality."""
    if aggregation == "keywords":
        return answer is not None and exact_match(answer, gold)
    return answer == gold


def open_run(config, budget_settings: Settings, data: LoadedDataset, *, epsilon: float | None,
             noise_multiplier: float | None, queries: int | None, run_id: str, limit: int | None = None,
             lm=None, announce=None):
    """(the `Budget`, a `PrivateAnswerer`, the run's public and private folders): the plan from public counts,
    the key and noise from `config.seed` (None: cryptographically seeded), the key in the private folder.
    `announce(budget)` is called first thing after the plan (the budget line, before any check of the ledger).
    Nothing is charged here."""
    delta = run_delta(config, len(data.train))
    budget = plan_budget(len(data.train), delta, budget_settings, epsilon=epsilon,
                         noise_multiplier=noise_multiplier, queries=queries, limit=limit,
                         aggregation=aggregation_for(data.spec.kind))
    if announce is not None:
        announce(budget)
    # the ledger's dataset budget checked before anything is written or loaded (refused: exit 3)
    charge_spends(config.ledger_id, plan_spends(config.ledger_id, data.content_hash, run_id, [budget.plan]),
                  dry_run=True, fresh=True, same_records_ok=config.new_budget_for_same_records)
    paths = run_paths(data.spec.name, data.content_hash, run_id)
    rng, _ = noise_generator(config.seed)
    key = run_key(rng)
    write_key(paths.private, key)
    model = lm if lm is not None else language_model(config.model, device=config.device, dtype=config.dtype)
    answerer = PrivateAnswerer(model, data, budget, dataset_id=config.ledger_id, run_id=run_id, rng=rng, key=key,
                               vote_mode=budget_settings.vote_mode,
                               same_records_ok=config.new_budget_for_same_records)
    return budget, answerer, paths


# --------------------------------------------------------------------------- in a run (`dpicl run --methods`)

RESULTS_FILE = "dp_icl_results.parquet"         # its rows of the comparison, in the public run folder
ANSWERS_FILE = "dp_icl_answers_eps{}.json"      # the answers at one epsilon, in the public run folder
RUN_KEY_FILE = "dp_icl_key_eps{}.bin"           # the subset key of one epsilon's answers, in the private folder

# In a run: the answers (noisy argmax labels of the test items, or their noisy-majority keywords) and their accuracy
# are DP outputs; the plan's parameters and delta are functions of public counts (|D|, M, k, Q, B, K, the epsilon).
declare(f"file:*{ANSWERS_FILE.format('*')}", Kind.DP, "/answers", "/answers/**", "/accuracy", "/correct")
declare(f"file:*{ANSWERS_FILE.format('*')}", Kind.COUNT, "/delta", "/parameters/**")
declare(f"file:*{RESULTS_FILE}", Kind.DP, "/*/accuracy*", "/*/calibrated_accuracy*")
declare(f"file:*{RESULTS_FILE}", Kind.COUNT, "/*/delta", "/*/noise_multiplier", "/*/sampling_rate")
PLANNED_LOG = declare_log("dp-icl: %d test item(s) at epsilon %s: M=%d subsets x k=%d shots on %d private records "
                          "(q=%.4g), noise std %.4g per vote count", count=(4, 5, 6))
ANSWERED_LOG = declare_log("dp-icl: answered %d test item(s) at epsilon %s: accuracy %.3f", dp=(2,))


def run_settings(config) -> Settings:
    """The ensemble of a run's DP-ICL: the paper's (both presets hold it; their queries are unused, a run answers
    its test items), with each `dp_icl_*` field that is set."""
    return settings("cpu", "cpu", subsets=config.dp_icl.subsets, shots=config.dp_icl.shots,
                    queries_per_draw=config.dp_icl.queries_per_draw, vote_mode=config.dp_icl.vote_mode,
                    max_keywords=config.dp_icl.max_keywords)


def run_queries(config, num_test: int) -> int:
    """Q: the test items the run evaluates (`--test-size`, resolved on the test split by `build_run_plan`; all
    of them when unset); ConfigError when there is none."""
    if num_test < 1:
        raise ConfigError("dp-icl: the run has no test item to answer (its test split is empty)")
    check_test_size(config.test_size, num_test)
    return int(config.test_size or num_test)


def plans(config, data: LoadedDataset, delta: float) -> tuple[PrivacyPlan, ...]:
    """DP-ICL's plans on the run's data (`tasks.methods` protocol): one per finite epsilon > 0 of the run (at epsilon
    inf its answers would be no DP output, yet written to the public run folder: no row; epsilon 0 reads no
    record), each sized to answer the run's Q test items within that epsilon (`dp_icl_plan`: sigma calibrated;
    an extraction task's by keyword space aggregation at --dp-icl-max-keywords). Refused before any charge (one
    line naming the flag to change) for M k above the private records, or an epsilon that cannot answer Q items."""
    chosen = run_settings(config)
    records, queries = len(data.train), run_queries(config, len(data.test))
    if chosen.subsets * chosen.shots > records:
        raise ConfigError(f"dp-icl: --dp-icl-subsets x --dp-icl-shots = {chosen.subsets} x {chosen.shots} exceeds the "
                          f"{records} private records (q = M k / |D| > 1): lower them")
    shape = dict(subsets=chosen.subsets, shots=chosen.shots, queries_per_draw=chosen.queries_per_draw,
                 aggregation=aggregation_for(data.spec.kind), max_keywords=chosen.max_keywords)
    found = []
    for eps in sorted({float(e) for e in config.epsilons}):
        if not 0 < eps < math.inf:
            continue
        try:
            found.append(dp_icl_plan(eps, delta, queries, records, **shape))
        except ConfigError as error:
            raise ConfigError(f"dp-icl at epsilon {fmt_eps(eps)}: cannot answer the run's {queries} test items "
                              f"({error}): raise the epsilon or lower --test-size") from None
    return tuple(found)


def plan_line(plan: PrivacyPlan) -> tuple:
    """`PLANNED_LOG`'s arguments for one plan (public: parameters only): said before the run's charge."""
    p = plan.parameters
    return (int(p["queries"]), fmt_eps(plan.epsilon), int(p["subsets"]), int(p["shots"]), int(p["records"]),
            float(p["sampling_rate"]), float(p["noise_std"]))


def _eps_text(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


@uncached_task("dp-icl-answer", tags=["gpu"], task_run_name="dp-icl-answer-eps{epsilon:g}")
def answer(*, records_path: str, task_spec: str, epsilon: float, delta: float, parameters: dict, vote_mode: str,
           test_size: int | None, model: str, device: str = "auto", dtype: str = "auto", seed: int | None = None,
           noise_charged: bool = False, public_dir: str, private_dir: str) -> dict:
    """DP-ICL's answers to the run's test items (the first `test_size` of `select_test`'s order, as every
    method's evaluation) under one plan (`parameters`: its public parameters), charged by this attempt of the
    run: a subset key and noise of its own (the key in the private folder), the answers and their accuracy
    written to the public run folder (`ANSWERS_FILE`; an extraction task's answers to the private one,
    `answers_public`). Returns {epsilon, path, accuracy, n, seeded_noise}."""
    from tasks.ingest import private_split  # Prefect: loaded by the stage, not by the run's planning

    name = ANSWERS_FILE.format(_eps_text(epsilon))
    kept = kept_stage(locals())
    answered = kept.state() if kept is not None else None
    if answered is not None:  # an earlier attempt of the run answered: the same files again, nothing drawn
        return _write_answers(answered, Path(public_dir), Path(private_dir), name)
    if not noise_charged and not (kept is not None and kept.marked()):  # seeded or not: one set of answers
        raise DpiclError(f"dp-icl at epsilon {_eps_text(epsilon)}: this attempt did not charge the spend (an "
                         "earlier attempt of the run did) and it has no answers kept; answering again would spend "
                         "privacy the ledger charged once. Start a new run (a new --run-id).")
    plan = PrivacyPlan(METHOD, float(epsilon), float(delta), (), parameters)
    items = select_test(private_split(records_path, "test"), test_size)
    texts, gold = items["text"].astype(str).tolist(), items["label"].astype(str).tolist()
    if len(texts) != int(parameters["queries"]):
        raise DpiclError(f"dp-icl: the plan answers {parameters['queries']} test items, the run has {len(texts)}; "
                         "plan the run again")
    train = private_split(records_path, "train")
    records = list(zip(train["text"].astype(str), train["label"].astype(str), train["id"].astype(str), strict=True))
    rng, seeded = noise_generator(seed)  # None: cryptographically seeded
    key = run_key(rng)  # every epsilon's answers their own draws: separately charged, independent mechanisms
    write_key(Path(private_dir), key, RUN_KEY_FILE.format(_eps_text(epsilon)))
    what = f"dp-icl eps={_eps_text(epsilon)}: test items"  # the bar; a stop request ends it at the next draw
    answers = answer_queries(language_model(model, device, dtype), load_task_spec(task_spec), records, texts, plan,
                             key, rng, mode=vote_mode, progress=lambda done, total: report_progress(what, done, total))
    aggregation = str(parameters.get("aggregation", "rnm"))
    correct = sum(is_correct(a, g, aggregation) for a, g in zip(answers.labels, gold, strict=True))
    accuracy = correct / len(texts)
    rows = [{"test_item": i, "label": label} for i, label in enumerate(answers.labels)]
    public = {"method": METHOD, "epsilon": float(epsilon), "delta": float(delta), "vote_mode": vote_mode,
              "parameters": {k: parameters[k] for k in PUBLIC_PARAMETERS},
              "answers": rows if answers_public(aggregation) else [],
              "accuracy": accuracy, "correct": correct, "n": len(texts), "seeded_noise": bool(seeded)}
    answered = {"public": public, "private": None if answers_public(aggregation) else {"answers": rows}}
    if kept is not None:  # kept before anything is written: a retry writes these, never answers again
        kept.keep(answered)
    result = _write_answers(answered, Path(public_dir), Path(private_dir), name)
    stage_logger().info(ANSWERED_LOG, len(texts), _eps_text(epsilon), accuracy)
    return result


def _write_answers(answered: dict, public_dir: Path, private_dir: Path, name: str) -> dict:
    """The answers file (public; an extraction task's answers beside it in the private folder); `answer`'s result."""
    if answered["private"] is not None:
        write_json_atomic(private_dir / name, answered["private"])
    public = answered["public"]
    path = write_json_atomic(public_dir / name, public)
    return {"epsilon": float(public["epsilon"]), "path": str(path), "accuracy": public["accuracy"],
            "n": public["n"], "seeded_noise": public["seeded_noise"]}


def kept_stage(call: dict) -> KeptStage:
    """The answers' kept record and charge mark (`tasks.kept`: `dp-icl/eps<E>-<digest>` in the run's private
    folder), for the stage's public inputs: a stopped run resumed under its id answers a charged, unanswered
    plan once (nothing was released before its answers were kept) and rewrites a kept one, never answering it
    again."""
    inputs = {name: call.get(name) for name in ("epsilon", "parameters", "vote_mode", "test_size", "model", "seed")}
    return KeptStage.at_epsilon(call["private_dir"], METHOD, call["epsilon"], inputs)


def keep_charged(call: dict) -> None:
    """Mark the answers of `call` (`answer_call`) when this attempt charged them. Called right after the charge."""
    mark_if_charged(call, kept_stage(call))


def answers_public(aggregation: str) -> bool:
    """Whether answers to the dataset's own test items may be public: a label, yes (a DP vote of the exemplars);
    an extraction task's released keywords, no: they are words of the test item, a private record's text (its
    file's row), so they stay in the private folder and only their exact-match count is public. Answers to a
    caller's own queries (`--queries-file`, the endpoint) are the caller's."""
    return aggregation != "keywords"


def answer_call(config, ingested: Ingested, plan: PrivacyPlan, charged: bool) -> dict:
    """`answer`'s arguments for one of DP-ICL's plans in a run (its seed derived from the run's and the epsilon)."""
    return dict(records_path=ingested.records_path, task_spec=ingested.task_spec, epsilon=plan.epsilon,
                delta=plan.delta, parameters={k: plan.parameters[k] for k in PUBLIC_PARAMETERS},
                vote_mode=run_settings(config).vote_mode, test_size=config.test_size, model=config.model,
                device=config.device, dtype=config.dtype, seed=derive_seed(config.seed, METHOD, plan.epsilon),
                noise_charged=charged, public_dir=str(ingested.paths.public),
                private_dir=str(ingested.paths.private))


def result_rows(plans, answered: list[dict], vote_mode: str) -> list[dict]:
    """One results row per plan (the comparison's shape, `tasks.evaluate.plan_rows`): the accuracy of the answers
    over the Q items in the column of how the subsets voted (calibrated, or raw for black-box votes and for an
    extraction task's greedy answers; the other column empty), one set of answers (std 0), the plan's epsilon,
    delta, sigma and q. Public rows."""
    by_eps = {float(a["epsilon"]): a for a in answered}
    rows = []
    for plan in plans:
        found = by_eps[float(plan.epsilon)]
        calibrated = vote_mode == "calibrated" and plan.parameters.get("aggregation") != "keywords"
        column = "calibrated_accuracy" if calibrated else "accuracy"
        accuracies = dict.fromkeys(("accuracy_mean", "accuracy_std", "calibrated_accuracy_mean",
                                    "calibrated_accuracy_std"))
        accuracies.update({f"{column}_mean": float(found["accuracy"]), f"{column}_std": 0.0})
        rows.append({"method": METHOD, "epsilon": float(plan.epsilon), "delta": float(plan.delta),
                     "noise_multiplier": float(plan.parameters["noise_multiplier"]),
                     "sampling_rate": float(plan.parameters["sampling_rate"]), **accuracies, "seeds": 1,
                     "n": int(found["n"])})
    return rows


def write_results(rows: list[dict], public_dir: str) -> Path:
    """The method's results table (`RESULTS_FILE`) in the public run folder."""
    return write_table(pd.DataFrame(rows), Path(public_dir) / RESULTS_FILE)


def work(config, plan: PrivacyPlan, *, labels: int, record_tokens: int) -> runtime.Work:
    """One of DP-ICL's plans' model work in a run, from public sizes (`dpcore.lm.runtime`; the run's time
    estimate): ceil(Q / B) draws, each M prompts of k records whose prefix runs once, scoring the draw's B items
    (and, with calibrated votes, the content-free inputs) with their labels' tokens; for an extraction task each
    prompt answers the draw's B items greedily (`ANSWER_TOKENS` new tokens at most)."""
    p = plan.parameters
    prefix = int(p["shots"]) * (record_tokens + runtime.LINE_TOKENS)
    if p.get("aggregation") == "keywords":
        per_answer = record_tokens + runtime.LINE_TOKENS + ANSWER_TOKENS
        per_draw = int(p["subsets"]) * (prefix + int(p["queries_per_draw"]) * per_answer)
        return runtime.Work(evaluation=float(int(p["draws"]) * per_draw))
    per_item = record_tokens + runtime.LINE_TOKENS + 2 * labels
    extra = len(CONTENT_FREE_INPUTS) if run_settings(config).vote_mode == "calibrated" else 0
    per_draw = int(p["subsets"]) * (prefix + (int(p["queries_per_draw"]) + extra) * per_item)
    return runtime.Work(evaluation=float(int(p["draws"]) * per_draw))


__all__ = ["ANSWERS_FILE", "answers_public", "keep_charged", "Budget", "BudgetSpentError", "PUBLIC_PARAMETERS", "PrivateAnswerer", "RESULTS_FILE",
           "RUN_KEY_FILE", "Settings", "answer", "answer_call", "device_type", "is_correct", "open_run", "plan_budget", "plan_line",
           "plans", "result_rows", "run_delta", "run_queries", "run_settings", "settings", "work", "write_key",
           "write_results"]
