"""CLI: `dpicl serve`, a local model behind an OpenAI-compatible completions API on 127.0.0.1.

    dpicl serve [--model smollm2-135m] [--port 8000] [--name NAME] [--device auto]
                [--no-logprobs] [--no-echo] [--max-logprobs 20]
    dpicl serve --private --dataset sst2 (--epsilon E | --noise-multiplier S | both) [--queries Q] [...]

With `--private` it serves DP-ICL private prediction instead (`dpcore.dp_icl.server`): each request's batch of
queries is charged to the ledger before it is answered by the noisy vote of private exemplar subsets; the queries
the budget affords are said when it starts, and a batch beyond them is refused (HTTP 429), nothing charged.

Any OpenAI client (and `dpicl predict --endpoint http://127.0.0.1:PORT/v1`) can then prompt the model with an
exported release. The server binds the loopback interface only; prompts and completions are never logged.
Ctrl-C (or SIGTERM) stops it.
"""

from __future__ import annotations

import signal
import sys

from dpcore.dp_icl.server import create_private_app
from dpcore.errors import ConfigError
from flows.cli.common import command
from flows.cli.dp_icl import FIELDS, add_private_flags, new_run_id, prepare
from flows.cli.ui import port_in_use
from tasks.serve import completion_app

HOST = "127.0.0.1"
PRIVATE_FIELDS = tuple(f for f in FIELDS if f not in ("model", "device"))  # serve has its own --model, --device


PRIVATE_ONLY = ("epsilon", "noise_multiplier", "queries", "subsets", "shots", "queries_per_draw", "vote_mode",
                *PRIVATE_FIELDS)


def _serve(args) -> int:
    import uvicorn

    given = [f"--{name.replace('_', '-')}" for name in PRIVATE_ONLY if getattr(args, name, None) is not None]
    if not args.private and given:
        raise ConfigError(f"{', '.join(given)}: apply to --private only")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: not a TCP port (1-65535)")
    if args.max_logprobs < 0:
        raise ConfigError(f"--max-logprobs: must be >= 0, got {args.max_logprobs}")
    if port_in_use(HOST, args.port):
        raise ConfigError(f"--port {args.port}: {HOST}:{args.port} is already in use; pick a free port with --port")
    if args.private:
        return _serve_private(args, uvicorn)
    name = args.name or args.model
    app, loaded = completion_app(args.model, name=name, device=args.device, logprobs=not args.no_logprobs,
                                 echo=not args.no_echo, max_logprobs=args.max_logprobs)
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=args.port, log_config=None, access_log=False,
                                           lifespan="off"))

    def on_term(signum, frame):  # SIGTERM stops like Ctrl-C does
        server.should_exit = True

    previous = signal.signal(signal.SIGTERM, on_term)
    offers = ("no log-probabilities" if args.no_logprobs
              else f"log-probabilities (top {args.max_logprobs}{', no echo' if args.no_echo else ', echo'})")
    print(f"serving model {loaded} as {name!r} at http://{HOST}:{args.port}/v1 (OpenAI completions API, {offers}); "
          "Ctrl-C stops it", file=sys.stderr, flush=True)
    return _run(server, args.port, previous)


def _serve_private(args, uvicorn) -> int:
    """DP-ICL on the private records: the budget said, then every request charged before it is answered."""
    from tasks.dp_icl import open_run

    if args.name is not None or args.no_logprobs or args.no_echo:
        raise ConfigError("--name, --no-logprobs, --no-echo: apply to the completions server, not to --private")
    config, chosen, data = prepare(args)
    run_id = new_run_id()
    budget, answerer, paths = open_run(config, chosen, data, epsilon=args.epsilon,
                                       noise_multiplier=args.noise_multiplier, queries=args.queries, run_id=run_id,
                                       announce=lambda b: print(b.line(), file=sys.stderr, flush=True))
    server = uvicorn.Server(uvicorn.Config(create_private_app(answerer), host=HOST, port=args.port, log_config=None,
                                           access_log=False, lifespan="off"))

    def on_term(signum, frame):
        server.should_exit = True

    previous = signal.signal(signal.SIGTERM, on_term)
    print(f"serving DP-ICL private prediction on {data.spec.name} (ledger id {config.ledger_id}, run {run_id}) at "
          f"http://{HOST}:{args.port}/v1/dp-icl: {budget.queries} queries can be answered, each batch charged "
          "before it is answered; Ctrl-C stops it", file=sys.stderr, flush=True)
    code = _run(server, args.port, previous)
    print(f"answered {answerer.answered} of {budget.queries} queries", file=sys.stderr)
    return code


def _run(server, port: int, previous) -> int:
    """Serve until Ctrl-C or SIGTERM; the port refused is a one-line error."""
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn hands Ctrl-C back once it has shut down
        pass
    except SystemExit:  # uvicorn exits when it cannot bind the port
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise ConfigError(f"--port {port}: the server could not listen on {HOST}:{port}")
    print("server stopped", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    serve = command(
        subparsers, "serve", _serve, help="serve a local model through an OpenAI-compatible completions API on 127.0.0.1",
        description="A local dpicl model behind /v1/models and /v1/completions (logprobs, echo), for `dpicl predict "
                    "--endpoint` and any OpenAI client. Binds 127.0.0.1 only.")
    serve.add_argument("--model", default="smollm2-135m",
                       help="the embedded model (default smollm2-135m), a local model folder or a hub id")
    serve.add_argument("--name", default=None, help="the model's name in the API (default: --model)")
    serve.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000)")
    serve.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    serve.add_argument("--no-logprobs", action="store_true",
                       help="answer with text only (logprobs: null, echo ignored), like servers without "
                            "log-probabilities")
    serve.add_argument("--no-echo", action="store_true", help="refuse echo (400), like hosted APIs that dropped it")
    serve.add_argument("--max-logprobs", type=int, default=20, help="the largest logprobs k accepted (default 20)")
    serve.add_argument("--private", action="store_true",
                       help="serve DP-ICL private prediction on private records instead: each request's queries "
                            "charged to the ledger before they are answered (docs/methods/dp-icl.md)")
    add_private_flags(serve, config_fields=list(PRIVATE_FIELDS))
