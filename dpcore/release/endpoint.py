"""Answering with a released prompt through an OpenAI-compatible server (post-processing: no privacy cost).

A release's demonstrations (DP few-shot demos, PromptPATE's student prompt) are text any model can read
(Tang et al. Remark 4.1; Duan et al.): this module sends the prompts `dpcore.lm.icl` builds to a server that
speaks the OpenAI completions API (vLLM, llama.cpp's server, Ollama, hosted APIs, `dpicl serve`) through
the official `openai` client, and scores the labels from what the server returns:

- `echo`: the label's full log-probability, the quantity `dpcore.lm.icl.label_logprobs` computes. For each
  query and label, the prompt followed by the label's continuation `" " + verbalizer` is sent with
  `echo=True, logprobs=1`; the log-probabilities of the echoed tokens that lie inside the continuation
  (by `text_offset`) are summed.
- `logprobs`: the first token only. The prompt is sent with `max_tokens=1, logprobs=k`; a label's score
  is the log-probability of the longest returned top token that begins its continuation (a label whose
  first token is not among the top k gets the smallest returned log-probability: a bound).
- `text`: greedy text (`temperature=0`, stopped at a newline), matched to the label verbalizers; for
  servers that return no log-probabilities. No probabilities, no calibration.

`auto` probes the server with a content-free prompt and takes the first mode it supports, in that order.
With log-probabilities, contextual calibration is applied as `dpcore.release.predict.answer` applies it (the
content-free inputs of `dpcore.lm.icl`, in the same prompt). Extraction tasks answer with greedy text.
`answer` serves `dpicl predict`; `scorers` gives `dpcore.lm.icl.evaluate` the same scoring (`dpicl evaluate`).

The network client is built in one place (`connect`); every other function
takes an `Endpoint`. A server that is down, slow or refuses a request becomes one `EndpointError` naming
the endpoint and what to check (a server that does not implement the OpenAI API, answering HTTP 501 or
refusing every request, among them); `Unsupported` only ever chooses between scoring modes; the API key (`OPENAI_API_KEY`, else a placeholder local servers ignore)
is never part of a message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np
import openai

from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError, EndpointError
from dpcore.lm import icl

Scoring = Literal["auto", "echo", "logprobs", "text"]
SCORING_MODES: tuple[str, ...] = ("auto", "echo", "logprobs", "text")
TOP_LOGPROBS = (20, 5)  # tried in turn: 20 (vLLM's default cap), 5 (hosted APIs' cap)
PLACEHOLDER_KEY = "dpicl-no-key"  # sent when OPENAI_API_KEY is unset: local servers ignore the key
ANSWER_STOP = "\n"  # the ICL formats end an answer at a newline (`dpcore.lm.icl._cut_answer`)


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to reach a server. `url`: its base URL (`/v1` is added when the URL has no path);
    `model`: the served model's name (None: the server's only model); `timeout`: seconds per request;
    `retries`: further attempts after a failed connection, a timeout or a 5xx/429 answer; `batch_size`:
    prompts per request; `max_new_tokens`: greedy answer length of text answers."""

    url: str
    model: str | None = None
    timeout: float = 60.0
    retries: int = 2
    scoring: Scoring = "auto"
    batch_size: int = 8
    max_new_tokens: int = 12

    def __post_init__(self):
        if not self.timeout > 0:
            raise ConfigError(f"--timeout: must be > 0 seconds, got {self.timeout}")
        if self.retries < 0:
            raise ConfigError(f"--retries: must be >= 0, got {self.retries}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size: must be >= 1, got {self.batch_size}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens: must be >= 1, got {self.max_new_tokens}")
        if self.scoring not in SCORING_MODES:
            raise ConfigError(f"--scoring: one of {', '.join(SCORING_MODES)}, got {self.scoring!r}")
        base_url(self.url)  # a bad URL is refused before anything is sent


@dataclass
class Endpoint:
    """A connected server: its client (anything with the `openai.OpenAI` interface), base URL as messages show it
    (without credentials) and model."""

    client: Any
    url: str
    model: str
    config: EndpointConfig
    served: tuple[str, ...] = field(default_factory=tuple)


class NotFound(EndpointError):
    """The server answered 404: a wrong URL path, or a model (or route) it does not have."""


class Unsupported(Exception):
    """The server does not offer a scoring mode (it refused the request, or returned no log-probabilities)."""


def base_url(url: str) -> str:
    """The client's base URL: `http://host:port` gets `/v1`; a URL with a path is kept as given."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"--endpoint {shown_url(url)!r}: expected an http(s) URL such as http://127.0.0.1:8000/v1")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path or '/v1'}"


def shown_url(url: str) -> str:
    """`url` for a message: a `user:password@` part is left out."""
    parts = urlsplit(url)
    return url.replace(f"{parts.netloc}", parts.netloc.rsplit("@", 1)[-1], 1) if "@" in parts.netloc else url


def connect(config: EndpointConfig, known_model: str | None = None, client=None) -> Endpoint:
    """An `Endpoint` for `config`: the `openai` client (or `client`), and the model to ask for.

    The server's model list is read first, so a server that is down fails here with one clear error. The
    model is `config.model`, else the server's only model, else `known_model` when the server serves it."""
    full = base_url(config.url)
    url = shown_url(full)
    if client is None:
        client = openai.OpenAI(base_url=full, api_key=os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_KEY,
                               timeout=config.timeout, max_retries=config.retries)
    probe = Endpoint(client, url, config.model or "", config)
    try:
        served = tuple(m.id for m in _call(probe, lambda: list(client.models.list())))
    except (Unsupported, NotFound) as exc:  # no model list there: the model must be named
        if config.model is None:
            answer = str(exc) if isinstance(exc, Unsupported) else "HTTP 404"
            raise EndpointError(f"endpoint {url}: no model list there ({answer}): is it an OpenAI-compatible server "
                                "at this URL (its base URL usually ends in /v1)? If it is one without a model list, "
                                "name the model with --model") from None
        served = ()
    model = config.model
    if model is None:
        if len(served) == 1:
            model = served[0]
        elif known_model is not None and known_model in served:
            model = known_model
        else:
            raise ConfigError(f"--model: name the model to ask {url} for"
                              + (f" (it serves {', '.join(served)})" if served else ""))
    elif served and model not in served:
        raise EndpointError(f"endpoint {url}: no model {model!r} (it serves {', '.join(served)}); check --model")
    return Endpoint(client, url, model, config, served)


def _error_message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return " ".join(str(message).split())[:300]
    return " ".join(str(getattr(exc, "message", "") or type(exc).__name__).split())[:300]


def _call(endpoint: Endpoint, request):
    """`request()`, the client's failures turned into an `EndpointError` (or `Unsupported` for a 400/422/501)."""
    config = endpoint.config
    attempts = f"{config.retries + 1} attempt{'s' if config.retries else ''}"
    try:
        return request()
    except openai.APITimeoutError:
        raise EndpointError(f"endpoint {endpoint.url}: no answer within {config.timeout:g} s ({attempts}); "
                            "is the server overloaded? raise --timeout") from None
    except openai.APIConnectionError:
        raise EndpointError(f"endpoint {endpoint.url}: unreachable ({attempts}); is the server running at that "
                            "address?") from None
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise EndpointError(f"endpoint {endpoint.url}: the server refused the API key (HTTP {exc.status_code}); "
                            "set OPENAI_API_KEY") from None
    except openai.NotFoundError as exc:
        raise NotFound(f"endpoint {endpoint.url}: HTTP 404 ({_error_message(exc)}); check --model and the "
                            "URL (an OpenAI-compatible server's base URL usually ends in /v1)") from None
    except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
        raise Unsupported(f"HTTP {exc.status_code}: {_error_message(exc)}") from None
    except openai.APIStatusError as exc:
        if exc.status_code == 501:
            raise Unsupported(f"HTTP 501: {_error_message(exc)}") from None
        raise EndpointError(f"endpoint {endpoint.url}: HTTP {exc.status_code} ({_error_message(exc)})") from None
    except openai.APIError as exc:  # an answer that is not an OpenAI response
        raise EndpointError(f"endpoint {endpoint.url}: not an OpenAI-compatible answer ({type(exc).__name__}); "
                            "check the URL") from None


def _complete(endpoint: Endpoint, prompts: Sequence[str], **options) -> list:
    """The choices of completions of `prompts` (in order), `config.batch_size` prompts per request."""
    choices = []
    size = endpoint.config.batch_size
    for start in range(0, len(prompts), size):
        chunk = list(prompts[start:start + size])
        response = _call(endpoint, lambda chunk=chunk: endpoint.client.completions.create(
            model=endpoint.model, prompt=chunk if len(chunk) > 1 else chunk[0], **options))
        got = sorted(response.choices or [], key=lambda c: c.index)
        if len(got) != len(chunk):
            raise EndpointError(f"endpoint {endpoint.url}: {len(got)} completions for {len(chunk)} prompts (a server "
                                "that takes one prompt per request needs --batch-size 1)")
        choices.extend(got)
    return choices


# --------------------------------------------------------------------------- scoring modes


def continuations(spec: TaskSpec, labels: Sequence[str]) -> list[str]:
    """Each label's continuation after the prompt, as `dpcore.lm.icl.label_token_ids` scores it."""
    return [" " + spec.verbalizer(label) for label in labels]


def score_echo(endpoint: Endpoint, prompts: Sequence[str], conts: Sequence[str]) -> np.ndarray:
    """[n, L] log p(continuation | prompt): the echoed continuation tokens' log-probabilities, summed."""
    flat = [prompt + cont for prompt in prompts for cont in conts]
    choices = _complete(endpoint, flat, max_tokens=1, temperature=0, echo=True, logprobs=1)
    out = np.zeros(len(flat))
    for i, choice in enumerate(choices):
        prompt, cont = prompts[i // len(conts)], conts[i % len(conts)]
        lp = choice.logprobs
        if lp is None or not lp.token_logprobs or not lp.text_offset:
            raise Unsupported("no echoed log-probabilities")
        start, end = len(prompt), len(prompt) + len(cont)
        inside = [v for offset, v in zip(lp.text_offset, lp.token_logprobs, strict=False) if start <= offset < end]
        if not inside or any(v is None for v in inside):
            raise Unsupported("the echoed tokens do not separate the prompt from the label")
        out[i] = float(sum(inside))
    return out.reshape(len(prompts), len(conts))


def first_token_score(top: dict[str, float], cont: str) -> float | None:
    """The log-probability of the longest top token that begins `cont` (None when none does)."""
    matches = [(len(token), value) for token, value in top.items() if token.strip() and cont.startswith(token)]
    return max(matches)[1] if matches else None


def score_first_token(endpoint: Endpoint, prompts: Sequence[str], conts: Sequence[str],
                      k: int) -> tuple[np.ndarray, np.ndarray]:
    """([n, L] the first token of each continuation, read from the top-k log-probabilities of the next token;
    [n, L] True where no top token begins the continuation: its score is the smallest returned, a bound)."""
    choices = _complete(endpoint, prompts, max_tokens=1, temperature=0, logprobs=k)
    out = np.zeros((len(prompts), len(conts)))
    missing = np.zeros((len(prompts), len(conts)), dtype=bool)
    for i, choice in enumerate(choices):
        lp = choice.logprobs
        top = (lp.top_logprobs or [None])[0] if lp is not None else None
        if not top:
            raise Unsupported("no top log-probabilities")
        floor = min(top.values())
        for j, cont in enumerate(conts):
            value = first_token_score(top, cont)
            missing[i, j] = value is None
            out[i, j] = floor if value is None else value
    return out, missing


def generate(endpoint: Endpoint, prompts: Sequence[str]) -> list[str]:
    """Greedy answers (temperature 0), cut at the first newline and stripped."""
    try:
        choices = _complete(endpoint, prompts, max_tokens=endpoint.config.max_new_tokens, temperature=0,
                            stop=[ANSWER_STOP])
    except Unsupported as exc:  # text is the last mode: a refusal here is the server's, not a mode to skip
        raise EndpointError(f"endpoint {endpoint.url}: the server refused a completion request ({exc}): is it an "
                            f"OpenAI-compatible completions server serving model {endpoint.model}? check the URL "
                            "and --model") from None
    return [str(c.text or "").split(ANSWER_STOP, 1)[0].strip() for c in choices]


def match_label(text: str, spec: TaskSpec, labels: Sequence[str]) -> str | None:
    """The label whose verbalizer the answer is (after `icl.normalise_answer`), or whose verbalizer begins it
    at a word boundary (the longest such); None when no label matches."""
    answer = icl.normalise_answer(text)
    names = {label: icl.normalise_answer(spec.verbalizer(label)) for label in labels}
    for label, name in names.items():
        if name and answer == name:
            return label
    starts = [(len(name), label) for label, name in names.items() if name and answer.startswith(name + " ")]
    return max(starts)[1] if starts else None


def _logprob_modes(scoring: str) -> list[tuple[str, int | None]]:
    if scoring == "echo":
        return [("echo", None)]
    if scoring == "logprobs":
        return [("logprobs", k) for k in TOP_LOGPROBS]
    return [("echo", None)] + [("logprobs", k) for k in TOP_LOGPROBS]


def _score(endpoint: Endpoint, mode: str, k: int | None, prompts: Sequence[str],
           conts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(log-probabilities [n, L], labels left unscored [n, L]: first-token scores outside the top k)."""
    if mode == "echo":
        scores = score_echo(endpoint, prompts, conts)
        return scores, np.zeros(scores.shape, dtype=bool)
    return score_first_token(endpoint, prompts, conts, k)


def detect_scoring(endpoint: Endpoint, spec: TaskSpec, demos: Sequence, labels: Sequence[str]) -> tuple[str, int | None]:
    """The first mode of `endpoint.config.scoring` the server supports, probed with a content-free query
    (`icl.CONTENT_FREE_INPUTS[0]`, never a user's text): (mode, top-k for `logprobs`)."""
    probe = [icl.prompt_text(spec, demos, icl.CONTENT_FREE_INPUTS[0])]
    conts = continuations(spec, labels)
    scoring = endpoint.config.scoring
    if scoring == "text":
        return "text", None
    reasons = []
    for mode, k in _logprob_modes(scoring):
        try:
            _score(endpoint, mode, k, probe, conts)
            return mode, k
        except Unsupported as exc:
            reasons.append(f"{mode}{'' if k is None else f' (top {k})'}: {exc}")
    if scoring == "auto":
        return "text", None
    raise EndpointError(f"endpoint {endpoint.url}: --scoring {scoring} is not supported by model {endpoint.model} "
                        f"({'; '.join(reasons)}); use --scoring auto")


def _scored(endpoint: Endpoint, mode: str, k: int | None, prompts: Sequence[str],
            conts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """`_score` after the probe chose the mode: a refusal now is an error, not a mode to skip."""
    try:
        return _score(endpoint, mode, k, prompts, conts)
    except Unsupported as exc:
        raise EndpointError(f"endpoint {endpoint.url}: the server refused a request ({exc})") from None


def text_labels(endpoint: Endpoint, spec: TaskSpec, labels: Sequence[str], prompts: Sequence[str]
                ) -> list[tuple[str | None, str]]:
    """(the label the greedy answer names, or None; the answer) per prompt (`match_label`)."""
    return [(match_label(text, spec, labels), text) for text in generate(endpoint, prompts)]


def answer(endpoint: Endpoint, spec: TaskSpec, demos: Sequence, queries: Sequence[str],
           calibrate: bool = True) -> list[dict]:
    """One dict per query, as `dpcore.release.predict.answer` gives: `prediction`, for classification scored from
    log-probabilities `probabilities` per label, and `scoring` (`echo`, `logprobs` or `text`) and
    `calibrated`; with `logprobs`, `unscored_labels`: the labels whose first token was not among the top k
    (their score is a bound). A text answer that matches no label has `prediction` None and the `answer`."""
    prompts = [icl.prompt_text(spec, demos, q) for q in queries]
    if spec.kind == "extraction":
        return [{"prediction": text, "scoring": "text", "calibrated": False} for text in generate(endpoint, prompts)]
    labels = spec.label_names
    mode, k = detect_scoring(endpoint, spec, demos, labels)
    if mode == "text":
        return [{"prediction": label, "scoring": "text", "calibrated": False} | ({} if label is not None else
                                                                                {"answer": text})
                for label, text in text_labels(endpoint, spec, labels, prompts)]
    conts = continuations(spec, labels)
    extra = [icl.prompt_text(spec, demos, x) for x in icl.CONTENT_FREE_INPUTS] if calibrate else []
    logprobs, unscored = _scored(endpoint, mode, k, prompts + extra, conts)
    probs = icl.normalise_probs(logprobs[: len(prompts)])
    if calibrate:
        probs = icl.calibrate_probs(probs, icl.normalise_probs(logprobs[len(prompts):]))
    rows = []
    for row, missing in zip(probs, unscored, strict=False):
        out = {"prediction": labels[int(row.argmax())], "probabilities": dict(zip(labels, map(float, row), strict=True)),
               "scoring": mode, "calibrated": calibrate}
        if mode == "logprobs":
            out["unscored_labels"] = [label for label, gone in zip(labels, missing, strict=True) if gone]
        rows.append(out)
    return rows


@dataclass(frozen=True)
class Scorers:
    """How `dpcore.lm.icl.evaluate` scores through a server: the mode the server supports (`text` for an
    extraction task), its top-k for `logprobs`, and `score` (label log-probabilities) or `answer` (text:
    for a classification task the matched label, "" when none matched)."""

    mode: str
    top_logprobs: int | None
    score: icl.LabelScorer | None = None
    answer: icl.TextAnswerer | None = None


def scorers(endpoint: Endpoint, spec: TaskSpec, labels: Sequence[str]) -> Scorers:
    """The `Scorers` of `spec` through `endpoint` (the scoring mode probed once, with a content-free query and
    no demonstrations), sending the prompts `dpcore.lm.icl` builds, as `answer` does."""
    def prompts(demos, queries):
        return [icl.prompt_text(spec, demos, q) for q in queries]

    if spec.kind == "extraction":
        return Scorers("text", None, answer=lambda demos, queries: generate(endpoint, prompts(demos, queries)))
    mode, k = detect_scoring(endpoint, spec, [], labels)
    if mode == "text":
        return Scorers("text", None, answer=lambda demos, queries: [
            label or "" for label, _ in text_labels(endpoint, spec, labels, prompts(demos, queries))])
    conts = continuations(spec, labels)
    return Scorers(mode, k, score=lambda demos, queries: _scored(endpoint, mode, k, prompts(demos, queries),
                                                                   conts)[0])
