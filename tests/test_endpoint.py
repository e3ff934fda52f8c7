"""A release used anywhere: `dpicl export` (the prompt template and its guarantee), `dpicl predict --endpoint`
through a real OpenAI-compatible server (`dpicl serve`'s engine on a real port), and the refusals.

Releases are registered here as `dpicl release` registers them (the manifest built by `dpcore.release.gate`, the
folder under `$DPICL_HOME/releases/`, an MLflow registry version with the `production` alias): the gate
itself is tested in test_release*.py; here the release is what export and predict read."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.data.artifacts import file_sha256, write_json_atomic, write_table
from dpcore.data.taskspec import load_task_spec
from dpcore.home import subdir
from dpcore.lm import icl
from dpcore.release import gate

LABELS = ("World", "Sports", "Business", "Technology")
DEMOS = [  # synthetic demonstrations standing in for DP outputs (one per label, shuffled order)
    ("The striker scored twice as the club won the cup final.", "Sports"),
    ("Shares of the bank rose after quarterly profit beat forecasts.", "Business"),
    ("Leaders met at the summit to discuss the border ceasefire.", "World"),
    ("The company unveiled a faster chip for laptops and phones.", "Technology"),
]
QUERIES = [
    "Oil prices climbed as investors weighed supply cuts.",
    "The goalkeeper saved a penalty in the semi-final.",
    "Rebels and the government signed a peace deal on {Sunday}.",
    "A new smartphone app encrypts every message by default.",
    "The central bank held interest rates steady.",
    "Voters in the capital lined up for the presidential election.",
    "The tennis champion retired after twenty years on tour.",
    "Researchers built a robot that learns to walk in an hour.",
]


# --------------------------------------------------------------------------- releases and servers


def _register(dataset_id: str, folder_files, manifest_of) -> dict:
    """A release folder and registry version as `tasks.release.register` makes them: `folder_files(folder)`
    writes the artifact and returns its path; `manifest_of(version, path)` is the release manifest, sealed by
    the version's tag."""
    from tasks.release import SEAL_TAG, registered_model_name
    from tasks.tracking import mlflow_client

    client = mlflow_client()
    name = registered_model_name(dataset_id)
    try:
        client.get_registered_model(name)
    except Exception:
        client.create_registered_model(name)
    version = 1 + max((int(v.version) for v in client.search_model_versions(f"name = '{name}'")), default=0)
    folder = subdir("releases") / dataset_id / f"v{version}"
    path = folder_files(folder)
    manifest = manifest_of(version, path)
    write_json_atomic(folder / "release.json", manifest)
    registered = client.create_model_version(name, source=folder.as_uri(), tags={
        "method": manifest["method"], SEAL_TAG: file_sha256(folder / "release.json")})
    client.set_registered_model_alias(name, "production", registered.version)
    return {**manifest, "release_dir": str(folder)}


def register_tang(dataset_id: str, model: str, task: str = "agnews", demos=DEMOS) -> dict:
    spec = load_task_spec(task)
    frame = pd.DataFrame([{"label": y, "text": t, "method": "tang", "epsilon": 4.0} for t, y in demos])
    spend = {"mechanism": "gaussian", "noise_multiplier": 0.8, "sampling_rate": 0.002, "steps": 20,
             "purpose": "pipeline"}
    artifact = gate.Artifact(method="tang", run_id=f"{dataset_id}-run", path=Path("."), name="demos", epsilon=4.0,
                             delta=1e-5, spends=(spend,), seeded_noise=False,
                             info={"model": model, "dataset": task, "dataset_id": dataset_id},
                             demos=tuple(demos), table=frame)

    def manifest_of(version, path):
        return gate.release_manifest(artifact, artifact_file=path.name, artifact_sha256=file_sha256(path),
                                     audit_summary={"passed": True}, code_version="test", accountant_versions={},
                                     version=version, ledger_spend=None, task_spec=spec.model_dump(mode="json"))

    return _register(dataset_id, lambda folder: write_table(frame, folder / "demos.parquet"), manifest_of)


def _artifact(method: str, dataset_id: str, model: str, demos=(), **info) -> gate.Artifact:
    spends = ({"mechanism": "gaussian", "noise_multiplier": 3.0, "sampling_rate": 1.0, "steps": 10,
               "purpose": method},)
    parameters = ({"teachers": 10, "shots": 1, "threshold": 5, "sigma1": 5.0, "sigma2": 3.0} if method == "pate"
                  else {"kind": "soft-prompt", "length": 2})
    return gate.Artifact(method=method, run_id=f"{dataset_id}-run", path=Path("."), name=f"{method}-artifact",
                         epsilon=8.0, delta=1e-5, spends=spends, seeded_noise=False,
                         info={"model": model, "dataset": "agnews", "dataset_id": dataset_id,
                               "parameters": parameters, **info}, demos=tuple(demos))


def register_artifact(method: str, dataset_id: str, model: str) -> dict:
    """A PromptPATE student prompt (demos.parquet) or a PromptDPSGD trained prompt (prompt.safetensors)."""
    spec = load_task_spec("agnews")
    artifact = _artifact(method, dataset_id, model, demos=DEMOS[:2] if method == "pate" else (),
                         model_weights_sha256="0" * 64)

    def files(folder):
        if method == "pate":
            return write_table(pd.DataFrame([{"text": t, "label": y} for t, y in artifact.demos]),
                               folder / "demos.parquet")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prompt.safetensors").write_bytes(b"trained prompt tensors")
        return folder / "prompt.safetensors"

    def manifest_of(version, path):
        return gate.release_manifest(artifact, artifact_file=path.name, artifact_sha256=file_sha256(path),
                                     audit_summary={"passed": True}, code_version="test", accountant_versions={},
                                     version=version, ledger_spend=None, task_spec=spec.model_dump(mode="json"))

    return _register(dataset_id, files, manifest_of)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class served:
    """`dpicl serve`'s engine over `lm` on a free 127.0.0.1 port, in a thread, for the `with` block."""

    def __init__(self, lm, name: str, **switches):
        from dpcore.lm.serve import BackgroundServer, CompletionEngine, create_app

        self.server = BackgroundServer(create_app(CompletionEngine(lm, name, **switches)), free_port())

    def __enter__(self) -> str:
        return self.server.start().url

    def __exit__(self, *exc):
        self.server.stop()


def _queries(tmp_path: Path, texts=QUERIES) -> Path:
    path = tmp_path / "queries.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _predict(cli, tmp_path: Path, dataset_id: str, *flags: str, name: str = "answers") -> tuple[list[dict], str]:
    out = tmp_path / f"{name}.jsonl"
    code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", dataset_id, "--out", str(out),
                        *flags])
    assert code == 0, err
    return [json.loads(line) for line in out.read_text().splitlines()], err


@pytest.fixture(scope="module")
def tiny_release(tiny_model_dir, tiny_lm):
    from tasks import common

    # the pipeline's model cache holds the session's tiny model under its folder's name (same weights)
    with common._MODELS_LOCK:
        common._MODELS[(str(tiny_model_dir), "auto", "auto")] = tiny_lm
    return register_tang("endpoint-tiny", str(tiny_model_dir))


# --------------------------------------------------------------------------- dpicl export


def test_export_json_is_the_prompt_the_local_scorer_builds(tiny_release, cli, agnews_spec):
    code, out, err = cli(["export", "--dataset-id", "endpoint-tiny"])
    assert code == 0, err
    exported = json.loads(out)
    # the guarantee at the top level, as every --json of dpicl
    assert (exported["epsilon"], exported["delta"], exported["method"]) == (4.0, 1e-5, "tang")
    assert (exported["noise_multiplier"], exported["sampling_rate"], exported["steps"]) == (0.8, 0.002, 20)
    assert exported["dataset_id"] == "endpoint-tiny" and exported["release_version"] == tiny_release["release_version"]
    assert exported["model"] == tiny_release["model"] and exported["audit_passed"] is True
    assert exported["labels"] == agnews_spec.labels and exported["content_free_inputs"] == ["N/A", "", "[MASK]"]
    assert exported["placeholder"] == "{text}" and exported["template"].count("{text}") == 1
    assert exported["shots"] == 4 and [(d["text"], d["label"]) for d in exported["demos"]] == DEMOS
    for query in QUERIES + [""]:  # a query holding braces too: the placeholder is replaced literally
        local = icl.prompt_text(agnews_spec, DEMOS, query)
        assert exported["template"].replace("{text}", query) == local
        assert exported["prompt_prefix"] + query + exported["prompt_suffix"] == local
    assert "no further privacy cost" in err


def test_export_text_is_the_template_alone_and_out_keeps_the_guarantee(tiny_release, cli, tmp_path):
    from dpcore.release.export import fill

    code, template, err = cli(["export", "--dataset-id", "endpoint-tiny", "--format", "text"])
    assert code == 0
    assert template.endswith("Article: {text}\nAnswer:")  # exactly the template: no newline added
    assert template.startswith("Classify the news articles") and all(text in template for text, _ in DEMOS)
    assert "epsilon 4.0" in err and "delta 1e-05" in err and "method tang" in err
    out = tmp_path / "prompt.txt"
    code, stdout, err = cli(["export", "--dataset-id", "endpoint-tiny", "--format", "text", "--out", str(out),
                             "--placeholder", "<<QUERY>>"])
    assert code == 0 and stdout == ""
    assert fill(out.read_text(), "x", "<<QUERY>>") == template.replace("{text}", "x")
    guarantee = Path(f"{out}.release.json")
    assert guarantee.read_bytes() == (Path(tiny_release["release_dir"]) / "release.json").read_bytes()
    # a placeholder the prompt already holds would change the demos when filled: refused
    code, _, err = cli(["export", "--dataset-id", "endpoint-tiny", "--placeholder", "club"])
    assert code == 2 and "--placeholder 'club'" in err and len(err.strip().splitlines()) == 1


def test_export_of_a_pate_student_prompt_names_its_parameters(cli, tmp_path, agnews_spec):
    register_artifact("pate", "endpoint-pate", "smollm2-135m")
    out = tmp_path / "student.json"
    code, _, err = cli(["export", "--dataset-id", "endpoint-pate", "--out", str(out)])
    assert code == 0, err
    exported = json.loads(out.read_text())
    assert (exported["method"], exported["epsilon"], exported["delta"]) == ("pate", 8.0, 1e-5)
    assert (exported["teachers"], exported["threshold"], exported["sigma1"], exported["sigma2"]) == (10, 5, 5.0, 3.0)
    assert exported["parameters"]["shots"] == 1 and exported["spends"][0]["purpose"] == "pate"
    assert exported["template"].replace("{text}", "q") == icl.prompt_text(agnews_spec, DEMOS[:2], "q")


def test_a_dpsgd_release_is_refused_by_export_and_by_endpoint(cli, tmp_path):
    register_artifact("dpsgd", "endpoint-dpsgd", "smollm2-135m")
    code, out, err = cli(["export", "--dataset-id", "endpoint-dpsgd"])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "PromptDPSGD trained prompt" in err and "cannot be exported" in err and "dpicl predict" in err
    # refused before any connection: the endpoint named here does not exist
    dead = f"http://127.0.0.1:{free_port()}/v1"
    code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-dpsgd",
                        "--endpoint", dead])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot be sent to an endpoint" in err and "on that local model (smollm2-135m)" in err
    assert "unreachable" not in err


def test_a_changed_release_record_is_refused_in_one_line(tiny_model_dir, cli, tmp_path):
    from tasks.release import SEAL_TAG, registered_model_name
    from tasks.tracking import mlflow_client

    release = register_tang("endpoint-sealed", str(tiny_model_dir))
    record = Path(release["release_dir"]) / "release.json"
    assert cli(["export", "--dataset-id", "endpoint-sealed"])[0] == 0
    edited = json.loads(record.read_text()) | {"epsilon": 0.1}  # a smaller epsilon than was released
    record.write_text(json.dumps(edited, indent=2))
    for argv in (["export", "--dataset-id", "endpoint-sealed"],
                 ["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-sealed"]):
        code, out, err = cli(argv)
        assert code == 2 and out == "" and "0.1" not in err, err
        assert "release.json changed since it was released" in _one_clear_line(err)
    # a record without a seal cannot be checked: refused too
    register_tang("endpoint-unsealed", str(tiny_model_dir))
    client = mlflow_client()
    name = registered_model_name("endpoint-unsealed")
    client.delete_model_version_tag(name, client.get_model_version_by_alias(name, "production").version, SEAL_TAG)
    code, _, err = cli(["export", "--dataset-id", "endpoint-unsealed"])
    assert code == 2 and "has no seal" in _one_clear_line(err)


def test_an_out_that_is_a_folder_is_refused_before_any_work(tiny_release, cli, tmp_path, monkeypatch):
    import tasks.release

    def no_work(*args, **kwargs):
        raise AssertionError("the release was read before --out was checked")

    monkeypatch.setattr(tasks.release, "answer_queries", no_work)
    monkeypatch.setattr(tasks.release, "export_release", no_work)
    (tmp_path / "taken.jsonl").mkdir()
    (tmp_path / "prompt.txt.release.json").mkdir()
    for argv in (["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny", "--out", str(tmp_path)],
                 ["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny", "--out",
                  str(tmp_path / "taken.jsonl")],
                 ["export", "--dataset-id", "endpoint-tiny", "--out", str(tmp_path)],
                 ["export", "--dataset-id", "endpoint-tiny", "--format", "text", "--out", str(tmp_path / "prompt.txt")]):
        code, out, err = cli(argv)
        assert code == 2 and out == "" and "is a folder; name the file to write" in _one_clear_line(err), err


class _NotOpenAI:
    """A server on a free 127.0.0.1 port that answers every request with HTTP 501, for the `with` block."""

    def __enter__(self) -> str:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                body = b'{"detail": "Not Implemented"}'
                self.send_response(501)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_server_that_is_not_openai_compatible_is_one_line(tiny_release, cli, tmp_path):
    with _NotOpenAI() as url:
        predict = ["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny", "--endpoint", url,
                   "--retries", "0"]
        code, out, err = cli(predict)
        line = _one_clear_line(err)
        assert code == 2 and out == "" and "lists no models" not in line
        assert f"endpoint {url}: no model list there (HTTP 501" in line and "OpenAI-compatible" in line
        code, out, err = cli([*predict, "--model", "any"])
        line = _one_clear_line(err)
        assert code == 2 and out == "" and "refused a completion request (HTTP 501" in line, err


# --------------------------------------------------------------------------- predict through a real server


def test_endpoint_with_echoed_logprobs_agrees_with_local_predict(tiny_release, tiny_lm, tiny_model_dir, cli, tmp_path):
    local, _ = _predict(cli, tmp_path, "endpoint-tiny", name="local")
    raw, _ = _predict(cli, tmp_path, "endpoint-tiny", "--no-calibration", name="local-raw")
    with served(tiny_lm, "tiny") as url:
        remote, err = _predict(cli, tmp_path, "endpoint-tiny", "--endpoint", url, "--batch-size", "3", name="remote")
        remote_raw, _ = _predict(cli, tmp_path, "endpoint-tiny", "--endpoint", url, "--model", "tiny",
                                 "--no-calibration", name="remote-raw")
    assert "through endpoint" in err and "model tiny (scoring: echo)" in err and "no further privacy cost" in err
    for mine, theirs, calibrated in ((remote, local, True), (remote_raw, raw, False)):
        assert [r["id"] for r in mine] == [f"q{i}" for i in range(len(QUERIES))]
        assert [r["prediction"] for r in mine] == [r["prediction"] for r in theirs]
        assert all(r["scoring"] == "echo" and r["calibrated"] is calibrated for r in mine)
        got = np.array([[r["probabilities"][y] for y in LABELS] for r in mine])
        want = np.array([[r["probabilities"][y] for y in LABELS] for r in theirs])
        assert np.abs(got - want).max() < 1e-4
    # calibration changed something (so the agreement above covers it)
    assert not np.allclose([r["probabilities"]["World"] for r in local], [r["probabilities"]["World"] for r in raw])


def test_extraction_answers_through_the_endpoint_as_locally(tiny_lm, tiny_model_dir, cli, tmp_path):
    demos = [("A heist film directed by a debut filmmaker", "crime"), ("A space crew stranded on Mars", "sci-fi")]
    register_tang("endpoint-extraction", str(tiny_model_dir), task="movies-sample-genre", demos=demos)
    local, _ = _predict(cli, tmp_path, "endpoint-extraction", name="local")
    with served(tiny_lm, "tiny") as url:
        remote, _ = _predict(cli, tmp_path, "endpoint-extraction", "--endpoint", url, name="remote")
    assert [r["prediction"] for r in remote] == [r["prediction"] for r in local]
    assert any(r["prediction"] for r in remote) and all(r["scoring"] == "text" for r in remote)


@pytest.fixture(scope="module")
def labels_first_lm():
    """A tiny Llama that names the labels among its top tokens and in its greedy text, as a trained model does (the
    tiny random model ranks them nowhere): its weights scaled up (peaked, input-dependent scores) and a constant
    added to the label words' logits by an output layer with a bias (the same for every label: the order among the
    labels stays the model's)."""
    import torch

    from dpcore.lm.model import LanguageModel

    lm = LanguageModel.tiny_random(seed=0)
    spec = load_task_spec("agnews")
    with torch.no_grad():
        for param in lm.model.parameters():
            if param.dim() == 2:
                param.mul_(20)
        head = lm.model.lm_head
        biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        biased.weight = torch.nn.Parameter(head.weight.detach().clone())
        biased.bias.zero_()
        for label in spec.label_names:
            (token,) = lm.encode(" " + spec.verbalizer(label))  # one token each
            biased.bias[token] = 30.0
        lm.model.lm_head = biased
    return lm


def test_endpoint_without_echo_or_logprobs_agrees_with_local_predict(labels_first_lm, cli, tmp_path):
    """The first-token (no echo) and text (no log-probabilities) modes against the local scorer, on a model whose
    top tokens and greedy text are the labels."""
    from tasks import common

    name = "tiny-labels-first"
    with common._MODELS_LOCK:
        common._MODELS[(name, "auto", "auto")] = labels_first_lm
    register_tang("endpoint-labels-first", name)
    raw, _ = _predict(cli, tmp_path, "endpoint-labels-first", "--no-calibration", name="local-raw")
    assert len({r["prediction"] for r in raw}) > 1  # the scores depend on the query
    with served(labels_first_lm, name, echo=False) as url:
        first, err = _predict(cli, tmp_path, "endpoint-labels-first", "--endpoint", url, "--no-calibration",
                              name="first-token")
        forced = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-labels-first",
                      "--endpoint", url, "--scoring", "echo"])
    assert "scoring: logprobs" in err
    assert forced[0] == 2 and "--scoring echo is not supported" in forced[2] and "echo" in forced[2]
    # every label is one token of this tokenizer and among the top 20: first-token scores are the local scores
    # (calibration is applied alike: the echo test checks it)
    assert all(r["scoring"] == "logprobs" and r["unscored_labels"] == [] for r in first)
    assert [r["prediction"] for r in first] == [r["prediction"] for r in raw]
    got = np.array([[r["probabilities"][y] for y in LABELS] for r in first])
    want = np.array([[r["probabilities"][y] for y in LABELS] for r in raw])
    assert np.abs(got - want).max() < 1e-3
    with served(labels_first_lm, name, logprobs=False) as url:
        text, err = _predict(cli, tmp_path, "endpoint-labels-first", "--endpoint", url, name="text")
    assert "scoring: text" in err and all(r["scoring"] == "text" and "probabilities" not in r for r in text)
    matched = [(r, local_raw) for r, local_raw in zip(text, raw, strict=True) if r["prediction"] is not None]
    assert len(matched) == len(QUERIES)  # every greedy answer of this model starts with a label
    # a greedy label token is the argmax over the labels too: the raw (uncalibrated) local prediction
    assert all(r["prediction"] == local_raw["prediction"] for r, local_raw in matched)


# --------------------------------------------------------------------------- dpicl evaluate through a real server

TREC_DEMOS = pd.DataFrame({"label": ["Location", "Person", "Number", "Entity"],
                           "text": ["Where is Rome?", "Who wrote Hamlet?", "How many moons has Mars?",
                                    "What is the fastest animal?"], "method": "tang", "epsilon": 4.0})


def _evaluate(cli, tmp_path: Path, name: str, *flags: str) -> tuple[dict, str]:
    demos = tmp_path / "demos.parquet"
    if not demos.exists():
        TREC_DEMOS.to_parquet(demos)
    code, out, err = cli(["evaluate", "--dataset", "trec", "--demos", str(demos), "--test-size", "5", "--seeds", "2",
                          "--shots", "3", "--json", "--out", str(tmp_path / name), *flags])
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def test_evaluate_through_the_endpoint_gives_the_local_accuracy(tiny_release, tiny_lm, tiny_model_dir, cli,
                                                                tmp_path):
    local, _ = _evaluate(cli, tmp_path, "local", "--model", str(tiny_model_dir))
    with served(tiny_lm, "tiny") as url:
        remote, err = _evaluate(cli, tmp_path, "remote", "--endpoint", url, "--batch-size", "3")
    assert (remote["endpoint"], remote["model"], remote["scoring"], remote["top_logprobs"]) == (url, "tiny", "echo",
                                                                                                 None)
    assert (local["endpoint"], local["scoring"]) == (None, "local")
    assert f"the test texts and the demos are sent to endpoint {url}" in err and "scoring: echo" in err
    # the same prompts, demos per seed and test items: the same accuracies, raw and calibrated
    for key in ("method", "epsilon", "shots", "seeds", "n", "accuracy", "calibrated_accuracy", "calibrated"):
        assert remote[key] == local[key], key
    assert remote["calibrated"] is True and remote["n"] == 5 and len(remote["accuracy"]["per_seed"]) == 2
    assert json.loads((tmp_path / "remote" / "summary.json").read_text())["endpoint"] == url
    # ... item by item (the private predictions): the same labels, probabilities within float error
    mine, theirs = (pd.read_parquet(Path(r["private_out"]) / "predictions.parquet") for r in (remote, local))
    assert mine["pred_raw"].tolist() == theirs["pred_raw"].tolist()
    assert mine["pred_calibrated"].tolist() == theirs["pred_calibrated"].tolist()
    assert np.abs(np.stack(mine["calibrated_probs"]) - np.stack(theirs["calibrated_probs"])).max() < 1e-4
    assert not (tmp_path / "remote" / "predictions.parquet").exists()


def test_evaluate_by_text_answers_says_it_is_not_calibrated(tiny_release, tiny_lm, cli, tmp_path):
    with served(tiny_lm, "tiny", logprobs=False) as url:  # a server without log-probabilities
        result, _ = _evaluate(cli, tmp_path, "text", "--endpoint", url, "--seeds", "1")
        code, table, _ = cli(["evaluate", "--dataset", "trec", "--demos", str(tmp_path / "demos.parquet"),
                              "--test-size", "2", "--seeds", "1", "--endpoint", url, "--out", str(tmp_path / "t")])
    assert (result["scoring"], result["calibrated"]) == ("text", False)
    assert result["calibrated_accuracy"] == result["accuracy"]
    assert code == 0 and f"through endpoint {url} (scoring: text)" in table
    assert "no calibration applied (text answers: no probabilities)" in table


def test_evaluate_through_a_dead_endpoint_or_with_real_records_is_one_line_and_charges_nothing(tiny_release, cli,
                                                                                            tmp_path):
    from dpcore.privacy.ledger import Ledger

    before = {d: len(Ledger().entries(d)) for d in Ledger().dataset_ids()}
    dead = f"http://127.0.0.1:{free_port()}/v1"
    code, out, err = cli(["evaluate", "--dataset", "trec", "--baseline", "zero-shot", "--test-size", "2",
                          "--endpoint", dead, "--retries", "0", "--out", str(tmp_path / "dead"), "--json"])
    assert code == 2 and out == "" and not (tmp_path / "dead").exists()
    assert f"dpicl evaluate: error: endpoint {dead}: unreachable (1 attempt)" in _one_clear_line(err)
    # real records (random-real: an infinite spend) are refused before the charge and before any connection
    code, _, err = cli(["evaluate", "--dataset", "trec", "--baseline", "random-real", "--endpoint", dead])
    assert code == 2 and "never sent to an endpoint" in _one_clear_line(err) and "unreachable" not in err
    # ... and so are demos without a finite guarantee
    TREC_DEMOS.assign(method="sigma-zero", epsilon=float("inf")).to_parquet(tmp_path / "sigma0.parquet")
    code, _, err = cli(["evaluate", "--dataset", "trec", "--demos", str(tmp_path / "sigma0.parquet"),
                        "--endpoint", dead])
    assert code == 2 and "epsilon inf" in _one_clear_line(err)
    code, _, err = cli(["evaluate", "--dataset", "trec", "--baseline", "zero-shot", "--scoring", "echo"])
    assert code == 2 and "--scoring: apply to --endpoint only" in _one_clear_line(err)
    assert {d: len(Ledger().entries(d)) for d in Ledger().dataset_ids()} == before


# --------------------------------------------------------------------------- a server down, slow or wrong


def _one_clear_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_server_that_is_down_is_one_line_within_the_timeout(tiny_release, cli, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    began = time.monotonic()
    code, out, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny",
                          "--endpoint", url, "--timeout", "5", "--retries", "1"])
    assert code == 2 and out == "" and time.monotonic() - began < 5
    line = _one_clear_line(err)
    assert line.startswith("dpicl predict: error: endpoint") and url in line and "unreachable (2 attempts)" in line


def test_a_server_that_never_answers_times_out(tiny_release, cli, tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny",
                            "--endpoint", url, "--timeout", "0.5", "--retries", "0"])
        took = time.monotonic() - began
    assert code == 2 and took < 4
    assert "no answer within 0.5 s (1 attempt)" in _one_clear_line(err) and f"{url}/v1" in err


def test_a_model_the_server_does_not_serve_and_stray_flags_are_named(tiny_release, tiny_lm, cli, tmp_path):
    with served(tiny_lm, "tiny") as url:
        code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny",
                            "--endpoint", url, "--model", "gpt-x"])
        assert code == 2 and "no model 'gpt-x' (it serves tiny)" in _one_clear_line(err)
        code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny",
                            "--endpoint", url.removesuffix("/v1") + "/api", "--model", "tiny"])
        assert code == 2 and "HTTP 404" in _one_clear_line(err) and "check --model and the URL" in err
    code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny",
                        "--timeout", "3"])
    assert code == 2 and "--timeout: apply to --endpoint only" in err
    os.environ["OPENAI_API_KEY"] = "sk-secret-test-key"
    try:
        code, _, err = cli(["predict", "--input", str(_queries(tmp_path)), "--dataset-id", "endpoint-tiny",
                            "--endpoint", f"http://user:pw-secret@127.0.0.1:{free_port()}", "--retries", "0"])
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert code == 2 and "unreachable" in err and "sk-secret" not in err and "pw-secret" not in err


# --------------------------------------------------------------------------- the dpicl serve command


def _listening_addresses(port: int) -> set[str]:
    """The local addresses listening on `port` (Linux /proc/net/tcp: state 0A is LISTEN)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_dpicl_serve_answers_openai_clients_on_loopback_only(tiny_model_dir, tiny_lm, cli):
    """`dpicl serve` in this process's main thread (where it sets its SIGTERM handler, as the `dpicl` program does),
    an OpenAI client in another thread that ends it with SIGTERM."""
    import signal
    import threading

    import openai

    from flows.cli import main

    port = free_port()
    served_up, failures, second = threading.Event(), [], []

    def client():
        try:
            openai_client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                          timeout=10)
            deadline = time.monotonic() + 120
            while True:
                try:
                    models = [m.id for m in openai_client.models.list()]
                    break
                except openai.APIConnectionError:
                    assert time.monotonic() < deadline, "the server did not answer"
                    time.sleep(0.2)
            served_up.set()
            _answers_openai_clients(openai_client, port, models, tiny_lm)
            # the port is taken now: a second server is refused in one line, before any model is loaded
            second.append(main(["serve", "--model", "no-such-model", "--port", str(port)]))
        except BaseException as exc:  # raised again in the test's thread
            failures.append(exc)
        finally:
            if served_up.is_set():
                os.kill(os.getpid(), signal.SIGTERM)  # the server's handler stops it

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    code, _, err = cli(["serve", "--model", str(tiny_model_dir), "--name", "tiny", "--port", str(port), "--device",
                        "cpu"])
    thread.join(timeout=30)
    if failures:
        raise failures[0]
    assert code == 0 and served_up.is_set() and second == [2], err
    refusals = [line for line in err.splitlines() if "already in use" in line]
    assert len(refusals) == 1 and f"--port {port}: 127.0.0.1:{port} is already in use" in refusals[0]
    assert "serving model" in err and "server stopped" in err and "Traceback" not in err
    with socket.socket() as probe:  # stopped: nothing listens any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def _answers_openai_clients(client, port: int, models: list[str], tiny_lm) -> None:
    import openai

    assert models == ["tiny"]
    assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
    prompt = icl.prompt_text(load_task_spec("agnews"), DEMOS, QUERIES[0])
    reply = client.completions.create(model="tiny", prompt=prompt + " Sports", max_tokens=0, echo=True, logprobs=2)
    lp = reply.choices[0].logprobs
    assert reply.choices[0].text == prompt + " Sports" and lp.tokens[-1] == " Sports"
    assert lp.token_logprobs[0] is None and lp.text_offset[-1] == len(prompt)
    want = icl.label_logprobs_naive(tiny_lm, load_task_spec("agnews"), DEMOS, [QUERIES[0]], ["Sports"])[0, 0]
    assert abs(lp.token_logprobs[-1] - want) < 1e-4 and len(lp.top_logprobs[-1]) == 2
    greedy = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0, logprobs=1)
    assert len(greedy.choices[0].logprobs.tokens) == greedy.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=1, logprobs=50)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt=prompt, max_tokens=1)
