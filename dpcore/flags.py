"""How messages name a run's settings: the flag a person types and the key a YAML configuration sets.

A setting of a run has one flat name outside Python (`pate_teachers`, `num_subsets`): its command-line flag
(`--pate-teachers`), its key in `prefect.yaml`, a stored run's configuration and MLflow params. This module is
the ground floor every subsystem names its settings through (`flag`), so that no subsystem imports
`dpcore.config`, which composes them: the flat names are registered here by whoever declares them, a section
when its class is declared (`dpcore.section.Section`), `RunConfig` its own fields when `dpcore.config` is
imported (any process that holds a run's configuration has imported it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Command-line spellings that differ from `--field-name` (a switch that is on by default names its negation).
FLAG_SPELLINGS = {"rvp": "--no-rvp"}

# Every flat name of a run's setting declared so far (`register`).
_FLAT_NAMES: set[str] = set()


def register(names: Iterable[str]) -> None:
    """Declare `names` as flat names of a run's settings, which `flag` then names by their flag."""
    _FLAT_NAMES.update(names)


def cli_flag(name: str) -> str:
    """The command-line flag of a `RunConfig` field by its flat name: `pate_queries` -> `--pate-queries`."""
    return FLAG_SPELLINGS.get(name, "--" + name.replace("_", "-"))


def named(name: str, value: Any = None) -> str:
    """How a message names a setting by its flat name: the flag a person types, then the key a YAML configuration
    (prefect.yaml, a deployment's parameters) sets, since either may have set it: `--pate-queries (pate_queries)`;
    with a value, `--pate-public ood (pate_public: ood)`."""
    if value is None:
        return f"{cli_flag(name)} ({name})"
    return f"{cli_flag(name)} {value} ({name}: {value})"


def flag(field: str, value: Any = None) -> str:
    """How a message names a `RunConfig` field by its flat name (`named`): `--pate-queries (pate_queries)`; with a
    value, `--pate-public ood (pate_public: ood)`. A name that is no declared field (`register`; an argument of
    a dpcore function that no flag sets, `label_count`) is returned as it is."""
    if field not in _FLAT_NAMES:
        return field if value is None else f"{field} {value}"
    return named(field, value)


__all__ = ["FLAG_SPELLINGS", "cli_flag", "flag", "named", "register"]
