"""CLI: placeholder until its issue lands."""


def register(subparsers) -> None:
    return None
