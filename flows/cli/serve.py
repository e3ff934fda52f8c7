"""CLI: `dpicl serve`, a local model behind an OpenAI-compatible completions API on 127.0.0.1.

    dpicl serve [--model smollm2-135m] [--port 8000] [--name NAME] [--device auto]
                [--no-logprobs] [--no-echo] [--max-logprobs 20]

Any OpenAI client (and `dpicl predict --endpoint http://127.0.0.1:PORT/v1`) can then prompt the model with an
exported release. The server binds the loopback interface only; prompts and completions are never logged.
Ctrl-C (or SIGTERM) stops it.
"""

from __future__ import annotations

import signal
import sys

from dpcore.errors import ConfigError
from flows.cli.common import command
from flows.cli.ui import port_in_use
from tasks.serve import completion_app

HOST = "127.0.0.1"


def _serve(args) -> int:
    import uvicorn

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: not a TCP port (1-65535)")
    if args.max_logprobs < 0:
        raise ConfigError(f"--max-logprobs: must be >= 0, got {args.max_logprobs}")
    if port_in_use(HOST, args.port):
        raise ConfigError(f"--port {args.port}: {HOST}:{args.port} is already in use; pick a free port with --port")
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
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn hands Ctrl-C back once it has shut down
        pass
    except SystemExit:  # uvicorn exits when it cannot bind the port
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise ConfigError(f"--port {args.port}: the server could not listen on {HOST}:{args.port}")
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
