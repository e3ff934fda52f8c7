"""The `dpicl` command line. Each subcommand lives in its own module with `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dpcore.errors import DpiclError
from dpcore.home import configure_environment

COMMAND_MODULES = ["accounting", "generate", "evaluate", "audit", "ledger", "run", "release"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpicl", description="Differentially private few-shot demonstrations for in-context learning."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"flows.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_environment()  # before Prefect/MLflow read their settings
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = args.handler(args)
    except DpiclError as exc:
        print(f"dpicl {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
