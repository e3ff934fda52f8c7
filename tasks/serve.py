"""The model server of `dpicl serve`: a model of the model cache behind `dpcore.lm.serve`'s OpenAI-compatible app."""

from __future__ import annotations

from tasks.common import language_model


def completion_app(model: str, *, name: str | None = None, device: str = "auto", logprobs: bool = True,
                   echo: bool = True, max_logprobs: int = 20):
    """(the FastAPI app serving `model` as `name`, the loaded model's own name)."""
    from dpcore.lm.serve import CompletionEngine, create_app

    lm = language_model(model, device=device)
    engine = CompletionEngine(lm, name or model, logprobs=logprobs, echo=echo, max_logprobs=max_logprobs)
    return create_app(engine), lm.name
