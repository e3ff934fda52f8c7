"""A real Prefect server on 127.0.0.1 (the suite's shared one under xdist): the process work pools, deploy
everything in prefect.yaml, run the deployment with tiny parameters through `prefect worker start --run-once`,
then find the completed flow run through the API and its MLflow record.

Slow (a server, a deploy and a worker subprocess that imports the whole stack), but part of CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import prefect_test_server
import pytest
from pipeline_support import mini_agnews
from prefect_test_server import free_port

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _prefect() -> str:
    return str(Path(sys.executable).with_name("prefect"))


@pytest.fixture(scope="module")
def server(dpicl_home):
    """The suite's shared Prefect test server under xdist (`prefect_test_server`: a real server on 127.0.0.1, already
    migrated and running); otherwise `prefect server start` with PREFECT_HOME inside the test home, killed at the
    end. Its API, the environment of the `prefect` commands, and the Prefect home."""
    prefect_home = dpicl_home / "prefect-server"
    prefect_home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_API_HOST="127.0.0.1",
        PREFECT_LOGGING_TO_API_ENABLED="true",
        DO_NOT_TRACK="true",
        DPICL_HOME=str(dpicl_home),
        DPICL_REPO=str(REPO),
    )
    if os.environ.get(prefect_test_server.URL):
        url = prefect_test_server.wait_until_ready()
        yield {"url": url, "env": {**env, "PREFECT_API_URL": url}, "home": prefect_home}
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env["PREFECT_API_URL"] = url
    log = open(prefect_home / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([_prefect(), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start: {(prefect_home / 'server.log').read_text()[-3000:]}")
            time.sleep(1)
        yield {"url": url, "env": env, "home": prefect_home}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def _api(method: str, url: str, **kwargs) -> httpx.Response:
    """One API call, retried while the server answers 503: a SQLite server answers 503 while its scheduler holds
    the database's write lock, which on a loaded 2-core machine lasts seconds."""
    deadline = time.monotonic() + 90
    while True:
        response = httpx.request(method, url, timeout=30, **kwargs)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(2)


def _cli(args: list[str], env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    done = subprocess.run([_prefect(), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_deploy_from_prefect_yaml_and_run_with_a_process_worker(server, dpicl_home):
    from dpcore.config import RunConfig
    from tasks.tracking import mlflow_client

    env, url = server["env"], server["url"]
    from prefect.workers.process import ProcessWorker

    # the process pools `prefect work-pool create NAME --type process` makes, through the API (a command less to
    # start); the deployment and the worker below are Prefect's own commands
    template = ProcessWorker.get_default_base_job_template()
    for name in ("cpu", "gpu"):
        made = _api("POST", f"{url}/work_pools/", json={"name": name, "type": "process", "base_job_template": template})
        assert made.status_code in (201, 409), made.text
        assert _api("GET", f"{url}/work_pools/{name}").json()["type"] == "process"
    _cli(["--no-prompt", "deploy", "--all"], env)
    deployments = _api("POST", f"{url}/deployments/filter", json={}).json()
    assert {d["name"] for d in deployments} == {"dp-fewshot", "dp-fewshot-gpu", "scheduled-regeneration",
                                                 "audited-release"}
    regeneration = next(d for d in deployments if d["name"] == "scheduled-regeneration")
    assert [s["schedule"]["cron"] for s in regeneration["schedules"]] == ["0 3 * * 1"]
    assert next(d for d in deployments if d["name"] == "dp-fewshot-gpu")["work_pool_name"] == "gpu"
    deployment = _api("GET", f"{url}/deployments/name/dp-fewshot/dp-fewshot").json()
    assert deployment["entrypoint"] == "flows/pipeline.py:private_prompting_pipeline"
    assert deployment["work_pool_name"] == "cpu"
    assert deployment["parameters"]["config"]["dataset"] == "agnews"  # the yaml's defaults

    data_path, spec_path, _, _ = mini_agnews()
    config = RunConfig(dataset="agnews-mini", data_path=data_path, task_spec=spec_path, model="tiny-random",
                       epsilons=[4.0], num_subsets=2, subset_size=1, top_k=20, max_tokens=3, shots=4, seeds=1,
                       test_size=6, audit=False, baselines=["zero-shot"], seed=5)
    created = _api("POST", f"{url}/deployments/{deployment['id']}/create_flow_run",
                   json={"parameters": {"config": json.loads(config.model_dump_json())}})
    assert created.status_code == 201, created.text
    flow_run_id = created.json()["id"]

    _cli(["worker", "start", "--pool", "cpu", "--run-once"], env, timeout=420)

    run = _api("GET", f"{url}/flow_runs/{flow_run_id}").json()
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["deployment_id"] == deployment["id"]
    runs = _api("POST", f"{url}/flow_runs/filter",
                json={"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}}).json()
    assert flow_run_id in {r["id"] for r in runs}
    # the pipeline's own tasks and those of each method's subflow (DP few-shot generation's among them)
    subflows = _api("POST", f"{url}/flow_runs/filter",
                    json={"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}}).json()
    assert subflows and all(r["state"]["type"] == "COMPLETED" for r in subflows)
    tasks = _api("POST", f"{url}/task_runs/filter",
                 json={"flow_runs": {"id": {"any_": [flow_run_id, *(r["id"] for r in subflows)]}}}).json()
    names = {t["name"] for t in tasks}
    assert {"ingest", "partition", "calibrate", "record"} <= {n.rsplit("-", 1)[0] for n in names}
    assert sum(n.startswith("generate-tang-") for n in names) == 4

    client = mlflow_client()
    experiment = client.get_experiment_by_name("dp-fewshot/agnews-mini")
    records = client.search_runs([experiment.experiment_id],
                                 filter_string=f"tags.prefect_flow_run_id = '{flow_run_id}'")
    parents = [r for r in records if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.params["epsilons"] == "4.0"
    assert parent.data.params["model"] == "tiny-random"
    run_dir = next((dpicl_home / "runs" / "agnews-mini").glob(f"*/{parent.data.tags['dpicl_run_id']}"))
    assert (run_dir / "manifest.json").exists() and (run_dir / "demos.parquet").exists()
