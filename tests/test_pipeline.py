"""The Prefect pipeline end to end on the tiny model under one prefect_test_harness.

Checks every Parquet table's schema, the manifest hashes, the MLflow parent and nested
runs (params, metrics, tags, artifacts), the Prefect artifacts, caching (an identical
re-run does no generation; a retry of the same run reuses its noise, a new run draws
fresh noise) and a transient task failure being retried.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import (
    ended_task_runs,
    prefect_harness,  # noqa: F401  (the shared harness fixture)
    share_tiny_model,
    standard_run,
    tiny_config,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

PUBLIC_TABLES = {"calibration", "demos", "metrics", "audit", "audit_reference", "results", "label_counts"}
# the audit's figures (AUCs, intervals, TPRs, overlap): the private twins of the public verdict tables
PRIVATE_TABLES = {"records", "partitions", "sigma_zero_demos", "real_demos", "predictions", "mia_scores", "audit",
                  "audit_reference"}
DEMO_COLUMNS = {"label", "shot", "text", "tokens", "stop_reason", "noise_multiplier", "num_subsets", "subset_size",
                "top_k", "rvp", "max_tokens", "mechanism", "model", "seeded_noise", "method", "epsilon"}


@pytest.fixture(scope="module")
def run(tiny_lm):
    share_tiny_model(tiny_lm)
    return standard_run()


@pytest.fixture
def generation_calls(monkeypatch):
    """Count calls of Algorithm 1 (dpcore.fewshot.generation.generate_demos) made by the pipeline's tasks."""
    from dpcore.fewshot import generation

    calls = []
    real = generation.generate_demos

    def counting(*args, **kwargs):
        calls.append(kwargs.get("labels"))
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_demos", counting)
    return calls


def _tables(folder: Path) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in folder.glob("*.parquet")}


def test_a_fresh_run_writes_tang_never_dp(run):
    """Every table the run wrote (as stored, not as read back) and its results name the DP demos tang."""
    written = {f"{kind}/{name}": table for kind in ("run_dir", "private_run_dir")
               for name, table in _tables(Path(run[kind])).items() if "method" in table.columns}
    assert {"run_dir/demos", "run_dir/metrics", "run_dir/calibration"} <= set(written)
    assert {name: "dp" for name, table in written.items() if "dp" in set(table["method"].astype(str))} == {}
    assert "tang" in set(written["run_dir/demos"]["method"]) and "tang" in {r["method"] for r in run["results"]}


def test_run_folders_hold_every_table_with_its_schema(run):
    from dpcore.audit import procedures as audit
    from dpcore.lm import icl
    from tasks.calibrate import CALIBRATION_COLUMNS

    public, private = Path(run["run_dir"]), Path(run["private_run_dir"])
    assert public.parts[-3:] == ("agnews-mini", run["data_hash"][:12], run["run_id"])
    assert "private" in private.parts and private.parts[-3:] == public.parts[-3:]
    tables, secret = _tables(public), _tables(private)
    assert set(tables) == PUBLIC_TABLES
    assert set(secret) == PRIVATE_TABLES
    assert {"privacy_utility.png", "manifest.json"} <= {p.name for p in public.iterdir()}
    assert "roc.png" not in {p.name for p in public.iterdir()}  # a ROC is a statistic of private records
    private_files = {p.name for p in private.iterdir()}
    assert {"generation_stats.json", "manifest.json", "roc.png"} <= private_files

    assert list(tables["calibration"].columns) == CALIBRATION_COLUMNS
    calib = tables["calibration"].iloc[0]
    assert calib["epsilon"] == 2.0 and calib["method"] == "tang" and calib["noise_multiplier"] > 0
    smallest_label = tables["label_counts"]["records"].min()
    assert calib["epsilon_upper"] <= 2.0 + 1e-9 and calib["steps"] == 4
    assert calib["sampling_rate"] == pytest.approx(2 / smallest_label)  # q = MN/|D_y| at the largest q

    demos = tables["demos"]
    assert DEMO_COLUMNS <= set(demos.columns)
    assert set(demos["method"]) == {"tang", "instruction-only"}  # sigma = 0 demos stay private
    assert sorted(demos[demos["method"] == "tang"]["label"]) == ["Business", "Sports", "Technology", "World"]
    assert demos["seeded_noise"][demos["method"] == "tang"].all()
    assert set(secret["sigma_zero_demos"]["method"]) == {"sigma-zero"}
    assert (secret["sigma_zero_demos"]["noise_multiplier"] == 0).all()

    assert list(secret["predictions"].columns) == icl.PREDICTION_COLUMNS
    assert list(tables["metrics"].columns) == icl.METRIC_COLUMNS
    methods = {"zero-shot", "instruction-only", "sigma-zero", "random-real", "tang"}
    assert set(tables["metrics"]["method"]) == methods
    assert len(tables["metrics"]) == len(methods) * 2  # two seeds each
    assert (tables["metrics"]["n"] == 12).all()
    real_rows = secret["predictions"][secret["predictions"]["method"] == "random-real"]
    assert all(len(ids) == 0 for ids in real_rows["demo_ids"])  # the real demos' ids stay private
    assert list(secret["real_demos"]["seed"]) == [0, 1]
    assert all(len(ids) == 4 for ids in secret["real_demos"]["demo_ids"])

    assert list(secret["mia_scores"].columns) == audit.MIA_SCORE_COLUMNS
    assert set(secret["mia_scores"]["setting"]) == {"dp", "non-private"}
    figures = {"auc", "auc_ci_low", "auc_ci_high", "tpr_at_1pct_fpr", "epsilon_lower_bound", "max_overlap_tokens"}
    assert figures | {"setting", "epsilon", "passed", "reasons"} <= set(secret["audit"].columns)
    assert {"setting", "epsilon", "passed", "verdict", "reasons"} <= set(tables["audit"].columns)
    assert not figures & set(tables["audit"].columns) and not figures & set(tables["audit_reference"].columns)
    assert list(tables["audit"]["setting"]) == ["dp"] and list(tables["audit"]["epsilon"]) == [2.0]
    assert list(tables["audit_reference"]["setting"]) == ["non-private"]

    assert list(tables["label_counts"].columns) == ["label", "records"]
    assert tables["label_counts"]["records"].sum() == (secret["records"]["split"] == "train").sum()
    assert list(secret["records"].columns) == ["split", "id", "text", "label"]
    assert list(secret["partitions"].columns) == ["label", "position", "id"]

    results = tables["results"]
    assert {"method", "epsilon", "accuracy_mean", "accuracy_std", "calibrated_accuracy_mean",
            "calibrated_accuracy_std", "audit"} <= set(results.columns) and "mia_auc" not in results.columns
    assert len(results) == len(methods)
    assert results.loc[results["method"] == "tang", "audit"].isin(["passed", "inconclusive", "failed"]).all()


def test_manifest_hashes_every_public_file(run):
    from dpcore.data.artifacts import file_sha256, verify_manifest

    public = Path(run["run_dir"])
    manifest = json.loads((public / "manifest.json").read_text())
    files = {p.name for p in public.iterdir() if p.is_file() and p.name != "manifest.json"}
    assert set(manifest["files"]) == files
    assert manifest["files"]["demos.parquet"] == file_sha256(public / "demos.parquet")
    assert verify_manifest(public) == []
    assert manifest["run_id"] == run["run_id"] and manifest["data_hash"] == run["data_hash"]
    assert manifest["config"]["epsilons"] == "2.0" and manifest["seeded_noise"] is True
    assert verify_manifest(Path(run["private_run_dir"])) == []
    (public / "demos.parquet").write_bytes((public / "demos.parquet").read_bytes() + b"x")
    try:
        assert verify_manifest(public) == ["demos.parquet"]
    finally:
        (public / "demos.parquet").write_bytes((public / "demos.parquet").read_bytes()[:-1])


def test_mlflow_parent_and_nested_runs(run):
    from tasks.tracking import mlflow_client

    client = mlflow_client()
    parent = client.get_run(run["mlflow_run_id"])
    config = tiny_config()
    for key, value in config.flat().items():
        assert parent.data.params[key] == value
    tags = parent.data.tags
    assert tags["data_hash"] == run["data_hash"] and tags["model"] == "tiny-random"
    assert tags["seeded_noise"] == "true" and tags["code_version"] and tags["dpicl_run_id"] == run["run_id"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"demos.parquet", "metrics.parquet", "privacy_utility.png", "manifest.json"} <= artifacts
    assert "roc.png" not in artifacts
    assert not artifacts & {f"{name}.parquet" for name in PRIVATE_TABLES - {"audit", "audit_reference"}}
    location = Path(client.get_experiment(parent.info.experiment_id).artifact_location.removeprefix("file://"))
    assert location.is_relative_to(Path(run["tracking_uri"].removeprefix("sqlite:///")).parent / "artifacts")

    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {child.info.run_name: child for child in children}
    assert set(by_name) == {"zero-shot-eps0", "instruction-only-eps0", "tang-eps2", "sigma-zero-epsinf",
                            "random-real-epsinf"}
    dp = by_name["tang-eps2"]
    for key in ("epsilon", "epsilon_upper", "delta", "noise_multiplier", "accuracy_mean", "accuracy_std",
                "calibrated_accuracy_mean", "calibrated_accuracy_std"):
        assert key in dp.data.metrics, key
    assert not {"mia_auc", "tpr_at_1pct_fpr"} & set(dp.data.metrics)  # the audit's figures stay private
    assert dp.data.tags["audit"] in ("passed", "inconclusive", "failed")
    records = pd.read_parquet(Path(run["private_run_dir"]) / "records.parquet")
    assert dp.data.metrics["epsilon"] == 2.0 and dp.data.metrics["delta"] == pytest.approx(
        1 / int((records["split"] == "train").sum()))
    calibration = pd.read_parquet(Path(run["run_dir"]) / "calibration.parquet").iloc[0]
    assert float(dp.data.params["sampling_rate"]) == pytest.approx(calibration["sampling_rate"])
    assert dp.data.params["steps"] == "4"
    assert dp.data.params["epsilons"] == "2.0" and dp.data.tags["method"] == "tang"
    expected = [r for r in run["results"] if r["method"] == "tang"][0]
    # the results rows are rounded to 6 digits (`jsonable_rows`)
    assert dp.data.metrics["calibrated_accuracy_mean"] == pytest.approx(expected["calibrated_accuracy_mean"], abs=1e-6)
    assert "epsilon" not in by_name["random-real-epsinf"].data.metrics  # infinite: a tag, not a metric
    assert by_name["random-real-epsinf"].data.tags["epsilon"] == "inf"


def test_prefect_artifacts_summarise_the_run(run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from tasks.record import SUMMARY_ARTIFACT_KEY, TABLE_ARTIFACT_KEY

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run["flow_run_id"]])))
    by_key = {a.key: a for a in artifacts}
    assert {SUMMARY_ARTIFACT_KEY, TABLE_ARTIFACT_KEY} <= set(by_key)
    markdown = by_key[SUMMARY_ARTIFACT_KEY].data
    assert run["run_id"] in markdown and "## Accuracy" in markdown and "## Audit" in markdown
    assert "| tang | 2 |" in markdown and run["mlflow_run_id"] in markdown
    table = by_key[TABLE_ARTIFACT_KEY].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert {row["method"] for row in rows} == {"zero-shot", "instruction-only", "tang", "sigma-zero", "random-real"}


def test_identical_rerun_is_cached_and_does_no_generation(run, generation_calls):
    from flows.pipeline import run_pipeline

    again = run_pipeline(tiny_config())
    assert generation_calls == []
    assert again["run_id"] != run["run_id"]
    first = pd.read_parquet(Path(run["run_dir"]) / "demos.parquet")
    second = pd.read_parquet(Path(again["run_dir"]) / "demos.parquet")
    pd.testing.assert_frame_equal(first, second)
    assert again["results"] == run["results"]


def test_a_stage_whose_folder_is_gone_runs_again_and_no_other(run, generation_calls):
    """Prefect keeps a cached stage's result in the stage's own folder: removing that folder (or the
    private folder of a stage with private outputs) makes that stage run again, and only it."""
    import shutil

    from flows.pipeline import run_pipeline
    from tasks.common import RESULT_RECORD, stage_path, stages_root

    def folders(stage: str) -> set[Path]:
        root = stages_root() / stage
        return set(root.iterdir()) if root.exists() else set()

    before = {stage: folders(stage) for stage in ("generate", "evaluate")}
    # A seed no other test uses: seeded stages are cached across runs, and a worker's tests share one home.
    config = tiny_config(seed=7117, audit=False, baselines=["zero-shot"], seeds=1)
    first = run_pipeline(config)
    assert len(generation_calls) == 4  # one task per label
    drawn = sorted(folders("generate") - before["generate"])
    evaluated = sorted(folders("evaluate") - before["evaluate"])
    assert len(drawn) == 4 and len(evaluated) == 2  # dp and zero-shot
    for folder in drawn:  # the record sits beside the outputs it names
        assert {p.name for p in folder.iterdir()} == {RESULT_RECORD, "demos.parquet"}
    assert all((folder / RESULT_RECORD).exists() for folder in evaluated)

    shutil.rmtree(drawn[0])
    shutil.rmtree(stage_path("evaluate", evaluated[0].name, private=True))
    stamp = (evaluated[1] / RESULT_RECORD).stat().st_mtime_ns
    again = run_pipeline(config)
    assert len(generation_calls) == 5  # the one removed shard, drawn again from the same seed
    assert (drawn[0] / "demos.parquet").exists()
    assert stage_path("evaluate", evaluated[0].name, private=True).exists()
    assert (evaluated[1] / RESULT_RECORD).stat().st_mtime_ns == stamp  # untouched: served from the cache
    assert again["results"] == first["results"]


def test_retry_of_a_run_reuses_its_noise_and_a_new_run_draws_fresh_noise(run, generation_calls):
    """Cryptographic noise (seed None): the generation cache is scoped to the run id."""
    from flows.pipeline import run_pipeline

    config = tiny_config(seed=None, audit=False, baselines=["zero-shot"], seeds=1)
    first = run_pipeline(config, run_id="retry-me")
    drawn = len(generation_calls)
    assert drawn == 4  # one task per label
    retried = run_pipeline(config, run_id="retry-me")
    assert len(generation_calls) == drawn  # nothing regenerated
    fresh = run_pipeline(config, run_id="another-run")
    assert len(generation_calls) == 2 * drawn
    demos = [pd.read_parquet(Path(r["run_dir"]) / "demos.parquet") for r in (first, retried, fresh)]
    assert not demos[0]["seeded_noise"].any()
    assert list(demos[0]["text"]) == list(demos[1]["text"])
    assert list(demos[0]["text"]) != list(demos[2]["text"])


def test_a_transient_failure_is_retried(run, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from dpcore.fewshot import generation
    from flows.pipeline import run_pipeline

    real = generation.generate_demos
    failures = []

    def flaky(*args, **kwargs):
        if not failures:
            failures.append(kwargs.get("labels"))
            raise ConnectionError("injected transient failure (a lost GPU worker)")
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_demos", flaky)
    result = run_pipeline(tiny_config(seed=321, audit=False, baselines=["zero-shot"], seeds=1))
    assert len(failures) == 1
    with get_client(sync_client=True) as client:  # the generation stages: task runs of tang's subflow
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[result["flow_run_id"]])))
    task_runs = ended_task_runs([r.id for r in subflows], until=lambda runs: sum(
        t.name.startswith("generate-tang") for t in runs) == 4)
    generations = [t for t in task_runs if t.name.startswith("generate-tang")]
    assert len(generations) == 4 and all(t.state.is_completed() for t in generations)
    assert sorted(t.run_count for t in generations) == [1, 1, 1, 2]


def test_user_errors_are_not_retried(run, monkeypatch):
    from dpcore.errors import ConfigError
    from dpcore.fewshot import generation
    from flows.pipeline import run_pipeline

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise ConfigError("subset_size: a label has fewer records than N")

    monkeypatch.setattr(generation, "generate_demos", broken)
    with pytest.raises(ConfigError, match="subset_size"):
        run_pipeline(tiny_config(seed=99, audit=False, baselines=[], seeds=1))
    # A deterministic error fails at once: each started generation task ran once (the first failure
    # cancels the rest), never a retry.
    assert 1 <= len(calls) <= 4
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterName,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    # Task-run states reach the server as events, after the flow returns: wait for them.
    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            failed = client.read_task_runs(task_run_filter=TaskRunFilter(
                name=TaskRunFilterName(like_="generate-tang"),
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.FAILED]))))
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert failed and all(t.run_count == 1 for t in failed)


def test_results_mark_infinite_epsilon(run):
    rows = {(r["method"], r["epsilon"]) for r in run["results"]}
    assert ("sigma-zero", "inf") in rows and ("random-real", "inf") in rows
    assert ("tang", 2.0) in rows
    assert not any(isinstance(r["epsilon"], float) and math.isinf(r["epsilon"]) for r in run["results"])


def test_run_and_demo_flags_cover_the_run_config(run):
    from flows.cli import build_parser
    from flows.cli.run import DEMO_DEFAULTS, _config, format_results
    from flows.runner import make_task_runner

    parser = build_parser()
    args = parser.parse_args(["run", "--dataset", "sst2", "--epsilons", "1,4", "--num-subsets", "3",
                              "--subset-size", "1", "--top-k", "50", "--no-rvp", "--max-tokens", "12", "--shots", "2",
                              "--seeds", "3", "--test-size", "30", "--no-audit", "--seed", "7", "--mechanism", "rnm",
                              "--baselines", "zero-shot,random-real", "--task-runner", "dask:3", "--json"])
    config = _config(args)
    assert (config.dataset, config.epsilons, config.num_subsets, config.subset_size, config.top_k) == (
        "sst2", [1.0, 4.0], 3, 1, 50)
    assert (config.rvp, config.max_tokens, config.shots, config.seeds, config.test_size, config.audit.enabled) == (
        False, 12, 2, 3, 30, False)
    assert (config.seed, config.mechanism, config.baselines, config.task_runner) == (
        7, "rnm", ["zero-shot", "random-real"], "dask:3")
    assert args.json
    demo = _config(parser.parse_args(["demo", "--test-size", "50", "--epsilon", "2", "--epsilon", "inf"]),
                   DEMO_DEFAULTS)
    assert demo.test_size == 50 and demo.epsilons == [2.0, math.inf]
    assert demo.num_subsets == DEMO_DEFAULTS["num_subsets"] and demo.max_tokens == DEMO_DEFAULTS["max_tokens"]
    assert demo.seed is None and demo.model == "smollm2-135m"
    # the demo's one non-private contrast is real demos; its conclusive audit is the DP demos' own
    assert demo.baselines == ["zero-shot", "random-real"] and demo.audit.enabled and not demo.audit.methods
    assert demo.methods == ["tang", "pate", "dpsgd"] and demo.dpsgd.validation_size == 32
    # the demo's audit is sized as a run's is: the fewest records that detect the default leak (AG News: 4
    # labels, 100 held-out test items), not sizes fixed in the preset
    from tasks.audit import run_audit_design

    assert not {"audit_trials", "audit_members", "audit_demo_sets"} & demo.flat_fields_set
    audit_config, design, note = run_audit_design(demo, dict.fromkeys(["a", "b", "c", "d"], 25000), 100)
    assert note is None and design.conclusive and design.scored_records <= 200

    table = format_results(run)
    assert "MLflow run id:   " + run["mlflow_run_id"] in table and run["run_dir"] in table
    from flows.cli.run import format_next

    # where to look next names the run; a method whose prompt was not audited gets the audit's command
    unaudited = format_next({**run, "methods": ["tang", "pate", "dpsgd"], "method_audits": [{"method": "pate"}]})
    assert f"dpicl release --run {run['run_id']} --method dpsgd --audit-only" in unaudited
    assert "--method pate --audit-only" not in unaudited and "--audit-only" not in format_next(run)
    assert table.splitlines()[0].split()[:2] == ["method", "epsilon"]

    assert make_task_runner("threads:3")._max_workers == 3
    assert make_task_runner("dask:3").cluster_kwargs["n_workers"] == 3
    from dpcore.errors import ConfigError

    with pytest.raises(ConfigError, match="task_runner"):
        make_task_runner("ray")


def test_seeds_keys_and_the_publish_guard(tmp_path):
    from dpcore.fewshot.config import GenerationConfig
    from dpcore.home import private_dir
    from tasks.common import derive_seed, noise_scope, publish, stage_key

    assert derive_seed(None, "dp", "World", 1.0) is None  # no seed: cryptographic noise
    seed = derive_seed(7, "dp", "World", 1.0)
    assert seed == derive_seed(7, "dp", "World", 1.0) and 0 <= seed < 2**63
    assert len({seed, derive_seed(7, "dp", "Sports", 1.0), derive_seed(7, "dp", "World", 8.0),
                derive_seed(8, "dp", "World", 1.0)}) == 4
    assert noise_scope(7, "run-a") == noise_scope(7, "run-b") != noise_scope(None, "run-a")
    fields = {"data_hash": "abc", "generation": GenerationConfig(), "epsilon": math.inf}
    assert stage_key("generate", fields) == stage_key("generate", dict(fields))
    assert stage_key("generate", fields) != stage_key("generate", {**fields, "generation": GenerationConfig(top_k=5)})
    assert stage_key("generate", fields) != stage_key("generate", {**fields, "data_hash": "abd"})

    secret = private_dir() / "test-publish" / "sigma_zero_demos.parquet"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(b"private")
    with pytest.raises(PermissionError):
        publish(secret, tmp_path)
    assert publish(secret, private_dir() / "test-publish-copy").read_bytes() == b"private"


def test_sigma_follows_the_plan_from_calibration_to_the_mechanism(run, monkeypatch):
    """One sigma per epsilon, decided once: the calibration table, the ledger's entries for the run, the
    demos and every call of the aggregation mechanism (Algorithm 1 lines 12 / 14-15) carry the sigma that
    `dpcore.fewshot.plan` calibrates for that epsilon, and the composed spend is that of the same events."""
    from dpcore.fewshot import generation
    from dpcore.fewshot.plan import fewshot_plan
    from dpcore.privacy.composition import compose
    from dpcore.privacy.ledger import Ledger
    from flows.pipeline import run_pipeline
    from tasks.calibrate import plan_arguments

    seen = []
    real = generation.aggregate

    def spy(mechanism, group_probs, noise_multiplier, rng):
        seen.append((mechanism, float(noise_multiplier)))
        return real(mechanism, group_probs, noise_multiplier, rng)

    monkeypatch.setattr(generation, "aggregate", spy)
    config = tiny_config(seed=9091, epsilons=[1.0, 4.0], audit=False, baselines=["zero-shot"], seeds=1)
    result = run_pipeline(config, run_id="sigma-trace")
    run_dir = Path(result["run_dir"])

    calibration = pd.read_parquet(run_dir / "calibration.parquet").set_index("epsilon")
    label_counts = pd.read_parquet(run_dir / "label_counts.parquet")
    counts = dict(zip(label_counts["label"], label_counts["records"], strict=True))
    direct = fewshot_plan(**plan_arguments(config, counts, float(calibration["delta"].iloc[0])))
    planned = {c.epsilon: c.noise_multiplier for c in direct.calibrations if c.method == "tang"}
    assert set(planned) == {1.0, 4.0} and planned[1.0] > planned[4.0] > 0
    for epsilon, sigma in planned.items():
        assert calibration.loc[epsilon, "noise_multiplier"] == sigma

    demos = pd.read_parquet(run_dir / "demos.parquet")
    dp_demos = demos[demos["method"] == "tang"]
    assert {e: set(g["noise_multiplier"]) for e, g in dp_demos.groupby("epsilon")} == {e: {s} for e, s in planned.items()}
    # every mechanism call used one of the planned sigmas, and both were used
    assert seen and {sigma for _, sigma in seen} == set(planned.values())
    assert {mechanism for mechanism, _ in seen} == {config.mechanism}

    entries = [e for e in Ledger().entries_for_run("sigma-trace") if e.purpose == "pipeline"]
    assert sorted(e.noise_multiplier for e in entries) == sorted(planned.values())
    for entry in entries:
        row = calibration.loc[[e for e, s in planned.items() if s == entry.noise_multiplier][0]]
        assert (entry.sampling_rate, entry.steps, entry.delta) == (row["sampling_rate"], row["steps"], row["delta"])
    delta = entries[0].delta
    ledger_spend = compose([e.event for e in entries], delta)
    plan_spend = compose([spend.event for p in direct.privacy_plans() for spend in p.spends
                          if p.method == "tang"], delta)
    assert ledger_spend.epsilon == plan_spend.epsilon
