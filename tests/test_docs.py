"""The documentation: README.md is a short front page that links every guide; every relative link in the
documents resolves (file and heading); no document names a path of one particular machine; and every flag the
documents show is one that dpicl (or a benchmark script) takes, on the command it is shown with."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
GUIDES = sorted((REPO / "docs").glob("*.md"))
DOCS = [README, REPO / "ARCHITECTURE.md", REPO / "benchmarks" / "RESULTS.md", *GUIDES]
README_MAX_LINES = 250

# Flags of other programs the documents show (pip in the install steps, the Prefect CLI in deployments).
OTHER_PROGRAMS_FLAGS = {"--no-deps", "--require-hashes", "--no-prompt", "--all", "--name", "--pool", "--run-once",
                        "--type", "--param", "--host"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]\b(?!-)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _all_markdown() -> list[Path]:
    """Every markdown file of the repository (not the virtual environment, caches or dpicl's home)."""
    return [path for path in sorted(REPO.rglob("*.md"))
            if not any(part.startswith(".") or part in {"node_modules", "build", "dist"}
                       for part in path.relative_to(REPO).parts[:-1])]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (lower-cased, punctuation dropped, spaces to dashes)."""
    anchors = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _code(text: str) -> list[str]:
    """The command lines of a document: inline code spans, and the lines of indented or fenced code blocks
    (a line ending in a backslash, or an indented line that starts with an option, continues the previous
    one). Comments after `#` are dropped."""
    commands: list[str] = []
    in_fence = False
    continuing = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continuing = False
            continue
        if in_fence or line.startswith("    "):
            body = line.split(" #")[0].strip()
            if commands and (continuing or body.startswith(("-", "["))):
                commands[-1] += " " + body.rstrip("\\")
            else:
                commands.append(body.rstrip("\\"))
            continuing = body.endswith("\\")
            continue
        continuing = False
        commands.extend(re.findall(r"`([^`\n]+)`", line))
    return commands


def _dpicl_options() -> dict[str, set[str]]:
    """Each dpicl command's options (a command with subcommands: all of theirs)."""
    from flows.cli import build_parser

    def options(parser: argparse.ArgumentParser) -> set[str]:
        found: set[str] = set()
        for action in parser._actions:
            found.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found |= options(sub)
        return found

    commands: dict[str, set[str]] = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update({name: options(sub) for name, sub in action.choices.items()})
    return commands


def _benchmark_options() -> set[str]:
    return {flag for path in (REPO / "benchmarks").glob("*.py")
            for flag in re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", path.read_text())}


def test_the_readme_is_a_front_page_that_links_every_guide():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, len(text.splitlines())
    links = set(LINK.findall(text))
    for target in [*(f"docs/{guide.name}" for guide in GUIDES), "benchmarks/RESULTS.md", "ARCHITECTURE.md"]:
        assert target in links, f"README.md does not link {target}"
    for needed in ("make demo", "make test", "--new-budget-for-same-records"):
        assert needed in text, needed


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            path = (doc.parent / file_part).resolve() if file_part else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_document_names_a_path_of_one_machine():
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in _all_markdown()
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"(?<![\w.])/(work|tmp)/", line)]
    assert not found, "\n".join(found)


def test_every_documented_flag_exists_on_its_command():
    commands = _dpicl_options()
    known = set().union(*commands.values()) | _benchmark_options() | OTHER_PROGRAMS_FLAGS
    unknown, misplaced = set(), []
    for doc in DOCS:
        text = doc.read_text()
        unknown |= {flag for flag in FLAG.findall(text) if flag not in known}
        for line in _code(text):
            for part in re.split(r"&&|;| \| ", line):
                match = re.search(r"\bdpicl (?:-v )?([a-z][a-z-]*)(.*)", part)
                if not match or match.group(1) not in commands:
                    continue
                for flag in FLAG.findall(match.group(2)):
                    if flag not in commands[match.group(1)]:
                        misplaced.append(f"{doc.relative_to(REPO)}: dpicl {match.group(1)} {flag}")
    assert not unknown, sorted(unknown)
    assert not misplaced, "\n".join(misplaced)
