"""The `--endpoint` flags shared by `dpicl predict` and `dpicl evaluate` (an OpenAI-compatible server answers
instead of a local model), their `EndpointConfig`, and the HTTP client's logs kept quiet."""

from __future__ import annotations

import argparse
import logging

from dpcore.errors import ConfigError

REMOTE_ONLY = ("timeout", "retries", "scoring")  # mean nothing without --endpoint
SIZES = ("batch_size", "max_new_tokens")


def add_endpoint_flags(parser: argparse.ArgumentParser, *, sizes: bool = True) -> None:
    """`--endpoint URL` and its flags, in one group. `sizes`: also `--batch-size` and `--max-new-tokens` as
    endpoint flags (a command that has its own keeps them, and they apply to the endpoint too)."""
    remote = parser.add_argument_group("answering through an OpenAI-compatible server (the API key is read from "
                                       "OPENAI_API_KEY; --model is the served model's name)")
    remote.add_argument("--endpoint", default=None, metavar="URL",
                        help="the server's base URL, e.g. http://127.0.0.1:8000/v1 (vLLM, llama.cpp, Ollama, a hosted "
                             "API, `dpicl serve`)")
    remote.add_argument("--timeout", type=float, default=None, help="seconds per request (default 60)")
    remote.add_argument("--retries", type=int, default=None,
                        help="further attempts after a connection failure, timeout or 5xx answer (default 2)")
    remote.add_argument("--scoring", choices=("auto", "echo", "logprobs", "text"), default=None,
                        help="echo: full label log-probabilities from the echoed prompt; logprobs: the first label "
                             "token among the top log-probabilities; text: greedy text matched to the labels (no "
                             "calibration); auto (default): the first the server supports")
    if sizes:
        parser.set_defaults(endpoint_sizes=True)
        remote.add_argument("--batch-size", type=int, default=None,
                            help="prompts per request (default 8; 1 for servers that take one prompt per request)")
        remote.add_argument("--max-new-tokens", type=int, default=None, help="length of text answers (default 12)")


def endpoint_config(args: argparse.Namespace, model: str | None):
    """The `EndpointConfig` of `--endpoint` and its flags for the served model `model` (None: the server's
    only one); None without `--endpoint`, where its own flags are refused, as is a local `--device` with it."""
    own = REMOTE_ONLY + (SIZES if getattr(args, "endpoint_sizes", False) else ())
    given = [f"--{name.replace('_', '-')}" for name in own if getattr(args, name, None) is not None]
    if args.endpoint is None:
        if given:
            raise ConfigError(f"{', '.join(given)}: apply to --endpoint only")
        return None
    for name in ("device", "dtype"):
        if getattr(args, name, None) not in (None, "auto"):
            raise ConfigError(f"--{name}: applies to a local model, not to --endpoint")
    # torch, openai load here, not for `dpicl --help`
    from dpcore.release.endpoint import EndpointConfig

    values = {name: getattr(args, name) for name in REMOTE_ONLY + SIZES if getattr(args, name, None) is not None}
    _quiet_client_logs()
    return EndpointConfig(url=args.endpoint, model=model, **values)


def _quiet_client_logs() -> None:
    """The HTTP client's debug lines hold request bodies (the queries): never logged, even with -v."""
    for name in ("openai", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
