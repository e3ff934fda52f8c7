"""What of each public output may depend on the private records, declared where the output is written.

Every public output (a `--json` object, a file outside the private store, MLflow params, metrics and tags, a
Prefect artifact, a log or terminal line) must be a function of public data, configuration and DP outputs.
The fields that are allowed to differ between neighbouring datasets are declared here, by output and path,
by the code that writes them, with a kind saying why:

- `DP`: a DP output, or a function of DP outputs and public data alone (the demos, noisy labels, a trained
  prompt, accuracies of those on public test items, a DP-released bound and the epsilon charged from it);
- `COUNT`: a record count the papers treat as public (|D|, |D_y|: they set q) or what is derived from counts
  alone (q, sigma, a plan's epsilon); it moves when a record is added, never when one is changed;
- `VERDICT`: the audit gate's verdict (passed, inconclusive, failed) and its figure-free reasons;
- `IDENTITY`: a name that differs on every run whatever the records (a ledger row's number, a keyed version id
  of the records that says only whether two runs read the same ones);
- `PUBLIC_TIMING`: the time of public work only (scoring public test items with a DP prompt).

Outputs are named `json:<command>` (a command's `--json`), `file:<name glob>` (a file outside the private store,
by its name), `mlflow` (runs as {name, params, metrics, tags}), `artifact:<key>` (a Prefect artifact: a table's
rows, or a markdown's tables as rows by header), `sqlite:<table>` (a row a command added to a database outside the private store: the
ledger's, MLflow's) and `line` (log and terminal lines, by a regex whose groups are the declared values).
Paths are `/`-separated keys and indices, each a glob (`*` any one, `records_*`); `**` stands for any number
of parts (JSON inside a string is read as JSON). Undeclared, a field
must be the same on neighbouring datasets: `tests/test_neighbours.py` checks every output against this.
"""

from __future__ import annotations

import fnmatch
import re
from enum import StrEnum

__all__ = ["Kind", "declare", "declare_line", "declare_log", "declared", "declared_lines", "matches"]


class Kind(StrEnum):
    DP = "dp"
    COUNT = "count"
    VERDICT = "verdict"
    IDENTITY = "identity"
    PUBLIC_TIMING = "public-timing"


_PATHS: dict[str, dict[tuple[str, ...], Kind]] = {}
_LINES: dict[str, Kind] = {}


def declare(output: str, kind: Kind, *paths: str) -> None:
    """Declare `paths` of `output` (see the module's names) as of `kind`."""
    table = _PATHS.setdefault(output, {})
    for path in paths:
        table[tuple(part for part in path.split("/") if part)] = kind


def declare_line(kind: Kind, pattern: str) -> str:
    """Declare the groups of `pattern` (a regex searched in each log and terminal line) as of `kind`; returns it."""
    re.compile(pattern)
    _LINES[pattern] = kind
    return pattern


def declare_log(fmt: str, **kinds: tuple[int, ...]) -> str:
    """Declare arguments of the %-format log message `fmt` by position (`dp=(2, 3)`, `public_timing=(6,)`);
    returns `fmt` for the logging call."""
    conversions = list(re.finditer(r"%[-#0 +]*\d*(?:\.\d+)?[sdfgeir%]", fmt))
    by_index = {i: Kind[name.upper()] for name, indices in kinds.items() for i in indices}
    pattern, last, index = "", 0, 0
    for conversion in conversions:
        pattern += re.escape(fmt[last:conversion.start()])
        last = conversion.end()
        if conversion.group() == "%%":
            pattern += "%"
            continue
        pattern += "(.*?)" if index in by_index else "(?:.*?)"
        index += 1
    pattern = "^" + pattern + re.escape(fmt[last:]) + "$"
    kind_of_groups = [by_index[i] for i in sorted(by_index)]
    if len(set(kind_of_groups)) > 1:  # one kind per declaration keeps the regex's groups unambiguous
        for i in sorted(by_index):
            declare_log(fmt, **{by_index[i].name.lower(): (i,)})
        return fmt
    if kind_of_groups:
        declare_line(kind_of_groups[0], pattern)
    return fmt


def declared(output: str) -> dict[tuple[str, ...], Kind]:
    """The declared paths of `output` (name globs of `file:` outputs matched with `matches`)."""
    return dict(_PATHS.get(output, {}))


def declared_outputs() -> dict[str, dict[tuple[str, ...], Kind]]:
    return {name: dict(paths) for name, paths in _PATHS.items()}


def declared_lines() -> dict[str, Kind]:
    return dict(_LINES)


def matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether `path` (keys and indices as strings) is `pattern` (a part is a glob: `*` any one part, `epsilon_*`;
    `**`: any number of parts)."""
    if not pattern:
        return not path
    if pattern[0] == "**":
        return any(matches(pattern[1:], path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], pattern[0]) and matches(pattern[1:], path[1:])
