"""The `dpicl` command line. Each subcommand lives in its own module with `register(subparsers)`; a module may also
fill a hook point of another command when it is imported (`flows.cli.private_prediction`: `serve --private`,
`predict --private`), so every module is imported before any registers its parser."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from dpcore.errors import DpiclError
from dpcore.home import configure_environment
from flows.cli.logs import configure_cli_logging

# The exit status of a command whose reader closed stdout early (`dpicl ledger show | head`): 128 + SIGPIPE,
# what the shell reports for any program ended by a closed pipe, so `set -o pipefail` scripts see that the
# output was cut short (0 would claim it was all read). Nothing else is printed: the reader asked for no more.
BROKEN_PIPE_EXIT = 141
COMMAND_MODULES = ["accounting", "generate", "evaluate", "audit", "ledger", "run", "pate", "tune", "release", "serve", "ui",
                   "dp_icl"]


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line, like every other user error (`dpicl run: error: argument --delta: ...`), exit 2;
    `--help` shows the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dpicl", description="Privacy-preserving in-context learning: DP few-shot generation, PromptPATE and PromptDPSGD on one ledger."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [importlib.import_module(f"flows.cli.{name}") for name in COMMAND_MODULES]  # hook points filled
    for module in modules:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `dpicl` program. With `argv=None` (the real command line) it also takes over logging:
    library logs go to `$DPICL_HOME/logs/dpicl.log` (see `flows.cli.logs`); an in-process caller
    passing `argv` keeps its own logging set-up."""
    configure_environment()  # before Prefect/MLflow read their settings
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:
        configure_cli_logging(args.verbose)
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE_EXIT
    except DpiclError as exc:
        action = getattr(args, "ledger_command", None)  # `dpicl ledger set-budget: error: ...`
        print(f"dpicl {args.command}{f' {action}' if action else ''}: {exc.kind}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dpicl {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush of a closed pipe must not print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # an in-process caller's stdout with no file descriptor
        pass


if __name__ == "__main__":
    sys.exit(main())
