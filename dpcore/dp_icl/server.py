"""DP-ICL behind HTTP: private prediction as an endpoint (`dpicl serve --private`; Wu et al. 2024's deployment,
every answered query a charged DP-ICL query).

- `GET /v1/dp-icl`: the public state: the plan's parameters (subsets, shots, noise, q), epsilon and delta, the
  queries the budget affords, those answered and those left;
- `POST /v1/dp-icl/answers` with `{"queries": ["text", ...]}`: one batch, charged to the ledger before it is
  answered (the answerer's `answer`), answered with `{"answers": [label or null, ...], "first_query": i,
  "queries_remaining": n, "ledger": {...}}`;
- a batch the budget cannot afford: HTTP 429 (`code: "budget_spent"`), one line, nothing charged, nothing
  answered; bad input: HTTP 400, one line.

The answerer (`tasks.dp_icl.PrivateAnswerer`: the plan, the ledger charge, the model) does the work; this module
only speaks HTTP. Queries and answers are never logged (the web server's access log is off).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from dpcore.errors import BudgetExceededError, ConfigError, DpiclError, EndpointError

MAX_BATCH = 256  # queries in one request: one charge, one batched pass over each draw's prompts


class AnswerRequest(BaseModel):
    """A batch of classification queries."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str]


def error_body(message: str, code: str) -> dict:
    """An OpenAI-shaped error body of one line."""
    return {"error": {"message": " ".join(str(message).split()), "type": "invalid_request_error", "code": code}}


def create_private_app(answerer) -> Any:
    """The FastAPI app answering through `answerer` (`answer(texts) -> dict`, `status() -> dict`)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="dpicl DP-ICL private prediction", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return JSONResponse(error_body(problems, "invalid_request"), status_code=400)

    @app.get("/v1/dp-icl")
    def status():
        return answerer.status()

    @app.post("/v1/dp-icl/answers")
    def answers(request: AnswerRequest):
        texts = request.queries
        if not texts:
            return JSONResponse(error_body("queries: at least one query", "invalid_request"), status_code=400)
        if len(texts) > MAX_BATCH:
            return JSONResponse(error_body(f"queries: at most {MAX_BATCH} per request, got {len(texts)}",
                                           "invalid_request"), status_code=400)
        if any(not isinstance(t, str) or not t.strip() for t in texts):
            return JSONResponse(error_body("queries: every query must be a non-empty string", "invalid_request"),
                                status_code=400)
        try:
            return answerer.answer(texts)
        except BudgetExceededError as exc:  # the plan's queries or the ledger's budget: nothing charged
            return JSONResponse(error_body(str(exc), "budget_spent"), status_code=429)
        except DpiclError as exc:
            return JSONResponse(error_body(str(exc), "invalid_request"), status_code=400)

    return app


def answers_url(base: str) -> str:
    """The answers route under a server's base URL (`http://127.0.0.1:8000/v1` or the server's root)."""
    base = base.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"--endpoint {base}: expected an http:// or https:// URL")
    return f"{base if base.endswith('/v1') else base + '/v1'}/dp-icl/answers"


def request_answers(base: str, texts: Sequence[str], timeout: float = 600.0) -> dict:
    """One batch sent to a DP-ICL server (the client of `dpicl predict --private`): its answer object. A refused
    batch (HTTP 429) is a `BudgetExceededError` with the server's one line; bad input (400) a `ConfigError`; no
    answer an `EndpointError`. The queries travel in the request body only."""
    body = json.dumps({"queries": list(texts)}).encode()
    request = urllib.request.Request(answers_url(base), data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}"
        if exc.code == 429:
            raise BudgetExceededError(message) from None
        if exc.code == 400:
            raise ConfigError(message) from None
        raise EndpointError(f"{answers_url(base)}: HTTP {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointError(f"{answers_url(base)}: no answer ({reason})") from None


__all__ = ["MAX_BATCH", "AnswerRequest", "answers_url", "create_private_app", "error_body", "request_answers"]
