"""CLI: `dpicl serve`, a local model behind an OpenAI-compatible completions API on 127.0.0.1.

    dpicl serve [--model smollm2-135m] [--port 8000] [--name NAME] [--device auto]
                [--no-logprobs] [--no-echo] [--max-logprobs 20]
    dpicl serve --private [the method's flags]

With `--private` it serves a private-prediction method instead, the one registered at
`flows.cli.private_prediction` (its own CLI module says what it serves and what each request is charged).

Any OpenAI client (and `dpicl predict --endpoint http://127.0.0.1:PORT/v1`) can then prompt the model with an
exported release. The server binds the loopback interface only; prompts and completions are never logged.
Ctrl-C (or SIGTERM) stops it.
"""

from __future__ import annotations

import signal
import sys

from dpcore.errors import ConfigError
from flows.cli import private_prediction
from flows.cli.common import command
from flows.cli.ui import port_in_use
from tasks.serve import completion_app

HOST = "127.0.0.1"


def _serve(args) -> int:
    import uvicorn

    private = private_prediction.registered()  # None: no --private, nor its flags
    given = [f"--{name.replace('_', '-')}" for name in (private.serve_only if private is not None else ())
             if getattr(args, name, None) is not None]
    if given and not args.private:
        raise ConfigError(f"{', '.join(given)}: apply to --private only")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: not a TCP port (1-65535)")
    if args.max_logprobs < 0:
        raise ConfigError(f"--max-logprobs: must be >= 0, got {args.max_logprobs}")
    if port_in_use(HOST, args.port):
        raise ConfigError(f"--port {args.port}: {HOST}:{args.port} is already in use; pick a free port with --port")

    def serve_app(app, start_line: str) -> int:
        server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=args.port, log_config=None, access_log=False,
                                               lifespan="off"))

        def on_term(signum, frame):  # SIGTERM stops like Ctrl-C does
            server.should_exit = True

        previous = signal.signal(signal.SIGTERM, on_term)
        print(start_line, file=sys.stderr, flush=True)
        return _run(server, args.port, previous)

    if private is not None and args.private:
        if args.name is not None or args.no_logprobs or args.no_echo:
            raise ConfigError("--name, --no-logprobs, --no-echo: apply to the completions server, not to --private")
        return private.serve(args, private_prediction.Listener(url=f"http://{HOST}:{args.port}", serve=serve_app))
    name = args.name or args.model
    app, loaded = completion_app(args.model, name=name, device=args.device, logprobs=not args.no_logprobs,
                                 echo=not args.no_echo, max_logprobs=args.max_logprobs)
    offers = ("no log-probabilities" if args.no_logprobs
              else f"log-probabilities (top {args.max_logprobs}{', no echo' if args.no_echo else ', echo'})")
    return serve_app(app, f"serving model {loaded} as {name!r} at http://{HOST}:{args.port}/v1 (OpenAI completions "
                          f"API, {offers}); Ctrl-C stops it")


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
    private = private_prediction.registered()
    if private is not None:
        serve.add_argument("--private", action="store_true", help=private.serve_help)
        private.add_serve_flags(serve)
