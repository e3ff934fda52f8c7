"""An OpenAI-compatible completions server over a local language model (`dpicl serve`).

It speaks the part of the OpenAI API that prompting with a released prompt needs, so any OpenAI client
(and `dpicl predict --endpoint`) can use a dpicl model, and the endpoint client is tested against a real
server:

- `GET /v1/models`: the one model served;
- `POST /v1/completions`: `prompt` (a string, a list of strings, or token ids), `max_tokens` (0 with
  `echo` scores the prompt only), `temperature` (0: greedy; above 0: sampled, `seed` optional), `stop`,
  `logprobs` k (each token's log-probability and the k most likely tokens at its position) and `echo`
  (the prompt's own tokens and log-probabilities in front of the completion). `n` > 1 and `stream` are
  refused (400).

Prompts are tokenized as dpicl's scorer tokenizes them (no special tokens added), so a label's
log-probability read from an echoed prompt is the one `dpcore.lm.icl` computes. Two switches imitate servers
that give less: `logprobs=False` answers every request with `logprobs: null` and ignores `echo` (servers
without log-probabilities), `echo=False` refuses `echo` (400, like hosted APIs that dropped it).

Nothing is logged about a request beyond what the web server's access log holds (method, path, status):
prompts and completions never reach a log.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

DEFAULT_MAX_LOGPROBS = 20


class CompletionRequest(BaseModel):
    """The fields of an OpenAI completions request this server reads (others are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    temperature: float | None = 1.0
    logprobs: int | None = None
    echo: bool | None = False
    stop: str | list[str] | None = None
    n: int | None = 1
    stream: bool | None = False
    seed: int | None = None


class RequestError(Exception):
    """A request the server will not answer: HTTP `status` with an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


class CompletionEngine:
    """Completions and their log-probabilities from a `dpcore.lm.model.LanguageModel`, one prompt at a time
    (a lock serialises the model; the server is for one user's prompts, not for throughput)."""

    def __init__(self, lm, name: str, *, logprobs: bool = True, echo: bool = True,
                 max_logprobs: int = DEFAULT_MAX_LOGPROBS):
        self.lm = lm
        self.name = name
        self.logprobs_enabled = logprobs
        self.echo_enabled = echo
        self.max_logprobs = max_logprobs
        self.context = int(getattr(lm.model.config, "max_position_embeddings", 0) or 0)
        self._lock = threading.Lock()
        self._texts: dict[int, str] = {}  # token id -> its text (top_logprobs keys)

    # ------------------------------------------------------------------ requests

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "dpicl"}]}

    def complete(self, request: CompletionRequest) -> dict:
        if request.model != self.name:
            raise RequestError(404, f"The model '{request.model}' does not exist; this server serves '{self.name}'",
                               code="model_not_found", param="model")
        if (request.n or 1) != 1:
            raise RequestError(400, "n: only n = 1 is supported", param="n")
        if request.stream:
            raise RequestError(400, "stream: streaming is not supported", param="stream")
        max_tokens = 16 if request.max_tokens is None else request.max_tokens
        if max_tokens < 0:
            raise RequestError(400, "max_tokens: must be >= 0", param="max_tokens")
        k = request.logprobs
        if k is not None and not 0 <= k <= self.max_logprobs:
            raise RequestError(400, f"logprobs: must be between 0 and {self.max_logprobs}", param="logprobs")
        echo = bool(request.echo)
        if echo and self.logprobs_enabled and not self.echo_enabled:
            raise RequestError(400, "echo: this server does not echo prompts", param="echo")
        if not self.logprobs_enabled:  # a server without log-probabilities: none, and no echo
            k, echo = None, False
        if max_tokens == 0 and not echo:
            raise RequestError(400, "max_tokens: 0 is allowed only with echo", param="max_tokens")
        stops = [request.stop] if isinstance(request.stop, str) else [s for s in (request.stop or []) if s]
        temperature = 1.0 if request.temperature is None else float(request.temperature)
        generator = None
        if temperature > 0 and request.seed is not None:
            generator = torch.Generator().manual_seed(int(request.seed))
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index, prompt in enumerate(self._prompts(request.prompt)):
            with self._lock:
                choice, used = self._one(prompt, max_tokens, temperature, k, echo, stops, generator)
            choices.append({"index": index, **choice})
            prompt_tokens += used[0]
            completion_tokens += used[1]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    # ------------------------------------------------------------------ one prompt

    def _prompts(self, prompt) -> list[str | list[int]]:
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        if not prompt:
            raise RequestError(400, "prompt: must not be empty", param="prompt")
        return list(prompt)

    def _tokens(self, prompt: str | list[int]) -> tuple[str, list[int], list[int]]:
        """(prompt text, its token ids, each token's character offset in the text)."""
        if isinstance(prompt, list):
            ids = [int(t) for t in prompt]
            if any(not 0 <= t < self.lm.vocab_size for t in ids):
                raise RequestError(400, "prompt: a token id is outside the vocabulary", param="prompt")
            pieces = [self._piece(ids[:i], ids[i]) for i in range(len(ids))]
            offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(ids))]
            return "".join(pieces), ids, offsets
        tokenizer = self.lm.tokenizer
        if getattr(tokenizer, "is_fast", False):
            encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(encoded["input_ids"])
            # a token's text starts where the previous one ended (byte-level tokenizers trim the leading
            # space off a token's own span, but the space belongs to it)
            ends = [int(end) for _, end in encoded["offset_mapping"]]
            offsets = [0] + ends[:-1] if ids else []
        else:
            ids = self.lm.encode(prompt)
            offsets = [len(self.lm.tokenizer.decode(ids[:i], clean_up_tokenization_spaces=False))
                       for i in range(len(ids))]
        return prompt, ids, offsets

    def _piece(self, before: list[int], token: int) -> str:
        """The text `token` adds after `before` (decoding in context keeps multi-byte characters whole)."""
        decode = self.lm.tokenizer.decode
        whole = decode(before + [token], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        head = decode(before, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return whole[len(head):] if whole.startswith(head) else decode([token], skip_special_tokens=True)

    def _token_text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.lm.tokenizer.decode([token], skip_special_tokens=False,
                                                                 clean_up_tokenization_spaces=False)
        return text

    def _top(self, values: list[float], ids: list[int]) -> dict[str, float]:
        """{token text: log-probability} of the top tokens (two ids of one text keep the larger)."""
        top: dict[str, float] = {}
        for value, token in zip(values, ids, strict=True):
            text = self._token_text(token)
            top[text] = max(top.get(text, -float("inf")), float(value))
        return top

    def _tops(self, logp: torch.Tensor, k: int, chosen: list[int]) -> list[dict[str, float]]:
        """The top-k dict of each row of `logp` [n, V] (k = 0: the chosen token's entry alone)."""
        if k > 0:
            values, ids = torch.topk(logp, k, dim=-1)
            return [self._top(v, i) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]
        rows = torch.arange(len(chosen))
        values = logp[rows, torch.as_tensor(chosen, dtype=torch.long)].tolist()
        return [self._top([v], [c]) for v, c in zip(values, chosen, strict=True)]

    @torch.inference_mode()
    def _one(self, prompt, max_tokens: int, temperature: float, k: int | None, echo: bool, stops: list[str],
             generator) -> tuple[dict, tuple[int, int]]:
        text, ids, offsets = self._tokens(prompt)
        if not ids:
            raise RequestError(400, "prompt: encodes to no tokens", param="prompt")
        if self.context and len(ids) + max_tokens > self.context:
            raise RequestError(400, f"This model's maximum context length is {self.context} tokens; the prompt has "
                                    f"{len(ids)} tokens and max_tokens is {max_tokens}", param="max_tokens")
        model, device = self.lm.model, self.lm.device
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        input_ids = torch.as_tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=input_ids, use_cache=True, logits_to_keep=0 if echo else 1)
        if echo:
            logp_all = torch.log_softmax(out.logits[0].float(), dim=-1)
            targets = torch.as_tensor(ids[1:], dtype=torch.long, device=logp_all.device)
            chosen = logp_all[:-1].gather(1, targets[:, None])[:, 0].tolist()
            tops = self._tops(logp_all[:-1], k or 0, ids[1:]) if k is not None else [None] * (len(ids) - 1)
            for i in range(len(ids)):
                end = offsets[i + 1] if i + 1 < len(ids) else len(text)
                tokens.append(text[offsets[i]:end])
                text_offset.append(offsets[i])
            # nothing predicts the first token
            token_logprobs.extend([None] + chosen)
            top_logprobs.extend([None] + tops)
            last = logp_all[-1]
        else:
            last = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        past = out.past_key_values
        generated: list[int] = []
        completion = ""
        finish = "length"
        for step in range(max_tokens):
            if temperature > 0:
                probs = torch.softmax(last / temperature, dim=-1).cpu()
                token = int(torch.multinomial(probs, 1, generator=generator))
            else:
                token = int(last.argmax())
            if token in self.lm.eos_token_ids:
                finish = "stop"
                break
            piece = self._piece(generated, token)
            generated.append(token)
            cut = _stop_at(completion + piece, stops)
            if k is not None:
                tokens.append(piece)
                token_logprobs.append(float(last[token]))
                top_logprobs.append(self._tops(last[None], k, [token])[0])
                text_offset.append(len(text if echo else "") + len(completion))
            if cut is not None:
                completion, finish = cut, "stop"
                break
            completion += piece
            if step == max_tokens - 1:
                break
            step_ids = torch.as_tensor([[token]], dtype=torch.long, device=device)
            out = model(input_ids=step_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            last = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        logprobs = None
        if k is not None:
            logprobs = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                        "text_offset": text_offset}
        choice = {"text": (text if echo else "") + completion, "logprobs": logprobs, "finish_reason": finish}
        return choice, (len(ids), len(generated))


def _stop_at(text: str, stops: list[str]) -> str | None:
    """`text` cut before its first stop sequence, or None when it holds none."""
    cuts = [text.index(s) for s in stops if s in text]
    return text[:min(cuts)] if cuts else None


def create_app(engine: CompletionEngine) -> Any:
    """The FastAPI application of `engine`: `/v1/models`, `/v1/completions`, errors in OpenAI's shape."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="dpicl OpenAI-compatible completions", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'][1:]) or 'body'}: {err['msg']}"
                             for err in exc.errors())
        return JSONResponse(RequestError(400, problems).body(), status_code=400)

    @app.get("/v1/models")
    def models():
        return engine.models()

    @app.get("/v1/models/{model_id:path}")
    def model(model_id: str):
        if model_id != engine.name:
            raise RequestError(404, f"The model '{model_id}' does not exist", code="model_not_found")
        return engine.models()["data"][0]

    @app.post("/v1/completions")
    def completions(request: CompletionRequest):
        return engine.complete(request)

    return app


class BackgroundServer:
    """`app` served by uvicorn on 127.0.0.1:`port` in a daemon thread (tests, notebooks); `stop()` ends it."""

    def __init__(self, app, port: int, host: str = "127.0.0.1"):
        import uvicorn

        self.url = f"http://{host}:{port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                                     lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name=f"dpicl-serve-{port}", daemon=True)

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
