"""DP-ICL as an endpoint (`dpicl serve --private`, `dpicl predict --private`) on a real loopback server with the tiny
model: every batch is charged before it is answered, the endpoint refuses at the budget (HTTP 429, one line,
nothing charged), two concurrent requests never overspend, the answers are the noisy-argmax labels of a fixed
seed, and the real command says the budget's queries when it starts and binds 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from test_dp_icl_cli import MARK, entries, write_dataset

from dpcore.errors import BudgetExceededError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/dp-icl/answers", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def data_flags(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("dp-icl-serve-data"))


@pytest.fixture(scope="module")
def loaded(data_flags):
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    return load_dataset(load_task_spec(data_flags[1]), data_flags[3])


def start(loaded, tiny_lm, run_id: str, *, epsilon=1.0, noise=0.8, seed=5):
    """A private answerer (3 queries at epsilon 1, sigma 0.8) on a real server: (url, answerer, server)."""
    from dpcore.config import RunConfig
    from dpcore.dp_icl.server import create_private_app
    from dpcore.lm.serve import BackgroundServer
    from tasks.dp_icl import open_run, settings

    config = RunConfig(dataset="dpicl-reviews", seed=seed)
    budget, answerer, _ = open_run(config, settings("cpu", subsets=4, shots=2), loaded, epsilon=epsilon,
                                   noise_multiplier=noise, queries=None, run_id=run_id, lm=tiny_lm)
    server = BackgroundServer(create_private_app(answerer), free_port()).start()
    return server.url, answerer, server


def test_each_batch_is_charged_before_it_is_answered_and_refused_at_the_budget(loaded, tiny_lm, monkeypatch,
                                                                               one_thread):
    from dpcore.dp_icl.privacy import queries_within
    from tasks import dp_icl

    url, answerer, server = start(loaded, tiny_lm, "serve-budget")
    try:
        n = len(loaded.train)
        assert answerer.budget.affordable == queries_within(1.0, 1 / n, 0.8, n, subsets=4, shots=2) == 3
        with urllib.request.urlopen(f"{url}/dp-icl", timeout=30) as response:
            status = json.loads(response.read())
        assert (status["queries_affordable"], status["queries_remaining"], status["subsets"]) == (3, 3, 4)
        seen = []
        real = dp_icl.answer_queries

        def answering(*args, **kwargs):
            seen.append(len(entries("serve-budget")))
            return real(*args, **kwargs)

        monkeypatch.setattr(dp_icl, "answer_queries", answering)
        code, body = post(url, {"queries": ["a great film", "awful"]})
        assert code == 200 and len(body["answers"]) == 2 and body["first_query"] == 0, body
        assert set(body["answers"]) <= {"positive", "negative"} and body["queries_remaining"] == 1
        assert seen == [1]  # the row was there before the votes were cast
        rows = entries("serve-budget")
        assert len(rows) == 1 and rows[0].steps == 2 and rows[0].purpose == "dp-icl"
        # over the budget: 429, one line, nothing charged, nothing answered
        code, body = post(url, {"queries": ["one", "two"]})
        assert code == 429 and body["error"]["code"] == "budget_spent", body
        assert "\n" not in body["error"]["message"] and "budget spent" in body["error"]["message"]
        assert len(entries("serve-budget")) == 1 and seen == [1]
        code, body = post(url, {"queries": ["the last one"]})
        assert code == 200 and body["first_query"] == 2 and body["queries_remaining"] == 0
        assert len(entries("serve-budget")) == 2 and seen == [1, 2]
        code, body = post(url, {"queries": ["beyond"]})
        assert code == 429 and len(entries("serve-budget")) == 2
        # the two batches compose to the plan's spend, within epsilon
        from dpcore.privacy.composition import compose

        total = compose([e.event for e in entries("serve-budget")], answerer.budget.plan.delta).epsilon
        assert total <= 1.0 + 1e-9
        assert total == pytest.approx(compose(list(e.event for e in answerer.budget.plan.spends),
                                              answerer.budget.plan.delta).epsilon, rel=1e-6)
        # bad input is a one-line 400, nothing charged
        for bad in ({"queries": []}, {"queries": [""]}, {"text": "x"}, {"queries": "x"}):
            code, body = post(url, bad)
            assert code == 400 and "\n" not in body["error"]["message"], body
        assert len(entries("serve-budget")) == 2
    finally:
        server.stop()


def test_two_concurrent_requests_never_both_pass_the_budget(loaded, tiny_lm, one_thread):
    url, answerer, server = start(loaded, tiny_lm, "serve-race")
    try:
        results = []
        barrier = threading.Barrier(2)

        def ask():
            barrier.wait()
            results.append(post(url, {"queries": ["first of two", "second of two"]}))

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(code for code, _ in results) == [200, 429], results
        rows = entries("serve-race")
        assert len(rows) == 1 and rows[0].steps == 2 and answerer.answered == 2
    finally:
        server.stop()


def test_answers_are_the_noisy_argmax_labels_of_a_fixed_seed(loaded, tiny_lm, one_thread):
    from dpcore.dp_icl import answer, subsets
    from dpcore.fewshot.mechanisms import noise_generator

    url, answerer, server = start(loaded, tiny_lm, "serve-seed", seed=9)
    try:
        _, first = post(url, {"queries": ["a great film", "awful"]})
        _, second = post(url, {"queries": ["quite fine"]})
    finally:
        server.stop()
    rng, _ = noise_generator(9)
    key = subsets.run_key(rng)
    records = list(zip(loaded.train["text"], loaded.train["label"], loaded.train["id"].astype(str), strict=True))
    plan = answerer.budget.plan
    a = answer.answer_queries(tiny_lm, loaded.spec, records, ["a great film", "awful"], plan, key, rng)
    b = answer.answer_queries(tiny_lm, loaded.spec, records, ["quite fine"], plan, key, rng, first_query=2)
    assert first["answers"] == list(a.labels) and second["answers"] == list(b.labels)


def test_predict_private_asks_the_server_and_stops_at_its_budget(loaded, tiny_lm, cli, tmp_path, one_thread):
    url, answerer, server = start(loaded, tiny_lm, "serve-predict")
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "a great film", "ref": 1}\n{"text": "awful", "ref": 2}\n')
    try:
        code, out, err = cli(["predict", "--private", "--endpoint", url, "--input", str(queries)])
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["ref"] for r in rows] == [1, 2] and {r["label"] for r in rows} <= {"positive", "negative"}
        assert "1 queries left" in err and len(entries("serve-predict")) == 1
        code, out, err = cli(["predict", "--private", "--endpoint", url, "--input", str(queries)])
        assert code == 3 and out == "" and len(err.strip().splitlines()) == 1 and "budget spent" in err, err
        assert len(entries("serve-predict")) == 1
        code, out, err = cli(["predict", "--private", "--input", str(queries)])
        assert code == 2 and "--endpoint" in err
    finally:
        server.stop()
    from dpcore.dp_icl.server import request_answers

    url, _, server = start(loaded, tiny_lm, "serve-predict-2")
    try:
        with pytest.raises(BudgetExceededError, match="budget spent"):
            request_answers(url, ["one", "two", "three", "four"])
    finally:
        server.stop()
    assert entries("serve-predict-2") == []


def test_the_real_command_says_the_budget_binds_loopback_and_stops_on_sigterm(cli, data_flags, one_thread):
    """`dpicl serve --private` in this process: its start line names the queries the budget affords
    (queries_within), it answers on 127.0.0.1 and a SIGTERM stops it."""
    port = free_port()
    replies = []
    flags = [f for f in data_flags if f not in ("--model", "tiny-random")]

    def client():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            return
        replies.append(post(f"http://127.0.0.1:{port}/v1", {"queries": ["a fine film"]}))
        os.kill(os.getpid(), signal.SIGTERM)  # the server's handler stops it

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    code, out, err = cli(["serve", "--private", *flags, "--model", "tiny-random", "--epsilon", "1",
                          "--noise-multiplier", "0.8", "--subsets", "4", "--shots", "2", "--port", str(port)])
    thread.join(timeout=10)
    assert code == 0, err
    assert "affords 3 queries" in err and f"http://127.0.0.1:{port}/v1/dp-icl" in err, err
    assert replies and replies[0][0] == 200 and "answered 1 of 3 queries" in err
    assert MARK not in out + err
    from flows.cli.serve import HOST

    assert HOST == "127.0.0.1"  # the only address the server binds
    with socket.socket() as s:  # stopped: nothing listens any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("flags, names", [
    (["--epsilon", "1"], "--epsilon: apply to --private only"),
    (["--private", "--epsilon", "1", "--queries", "0"], "argument --queries"),
    (["--private", "--epsilon", "1", "--vote-mode", "loud"], "argument --vote-mode"),
    (["--private"], "give --epsilon or --noise-multiplier"),
])
def test_serve_private_bad_input_is_one_line_exit_2_and_nothing_charged(data_flags, flags, names, capsys):
    from flows.cli import main

    before = len(entries())
    try:
        data = data_flags[:4] if "--private" in flags else []
        code = main(["serve", *data, *flags, "--port", str(free_port())])
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and captured.out == "" and len(lines) == 1 and names in lines[0], captured.err
    assert len(entries()) == before
