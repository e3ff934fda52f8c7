"""The import graph holds the layering: flows -> tasks -> dpcore, no circle inside a package, and
function-local imports only where they put off a heavy optional dependency.

The graph is read from the source with `ast` (nothing is imported): every `import` and `from ... import`
under dpcore/, tasks/ and flows/, at module level and inside functions alike, relative forms resolved and
`from pkg import module` taken as an import of that module. A circle that a function-local import dodges at
run time is still a circle here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dpcore", "tasks", "flows")
# Third-party packages slow enough to import (seconds, or a server's settings read) that a module may put
# them off until the function that needs them runs: `dpicl --help` and the light commands never load them.
HEAVY = frozenset({
    "torch", "transformers", "opacus", "peft", "accelerate", "safetensors", "huggingface_hub", "datasets",
    "mlflow", "prefect", "prefect_dask", "dask", "distributed", "matplotlib", "fastapi", "uvicorn", "openai",
    "scipy", "dp_accounting", "prv_accountant",
})
# What each layer must never import: imports point one way, flows -> tasks -> dpcore.
FORBIDDEN = {
    "dpcore": ("tasks", "flows", "prefect", "prefect_dask", "mlflow"),
    "tasks": ("flows",),
}
# Function-local imports that put off nothing heavy, per package (see `test_local_imports_only_put_off_heavy_
# dependencies`); the bound is what the code holds today and only goes down.
LOCAL_IMPORT_BOUND = {"dpcore": 8, "tasks": 40, "flows": 3}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (internal: the module file; external: as written)
    line: int
    local: bool  # inside a function body
    typing_only: bool = False  # under `if TYPE_CHECKING:`: a circle all the same, but never run


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, local: bool, typing_only: bool = False):
    """Every import node under `node`, with whether a function body holds it and whether only a type
    checker runs it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, local, typing_only
        inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner, typing_only or _is_type_checking(child))


def _internal(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted `name` that is a module of the tree."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            return prefix
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    is_package = path.name == "__init__.py"
    found = []
    for node, local, typing_only in _walk(ast.parse(path.read_text(), str(path)), False):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import module` imports that module; `from module import name` the module itself.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        for target in targets:
            found.append(Import(module, _internal(target, modules) or target, node.lineno, local, typing_only))
    return found


def import_graph(root: Path = ROOT) -> list[Import]:
    modules = source_files(root)
    return [imp for module, path in modules.items() for imp in imports_of(module, path, modules)]


def top_package(name: str) -> str:
    return name.split(".")[0]


def circles(imports: list[Import], package: str) -> list[list[str]]:
    """The strongly connected components (more than one module, or a module importing itself) of the
    graph of `package`'s modules importing each other (Tarjan)."""
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if top_package(imp.source) == package and top_package(imp.target) == package:
            edges.setdefault(imp.source, set()).add(imp.target)
            edges.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges[node]:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def heavy_loads(imports: list[Import]) -> dict[str, frozenset[str]]:
    """The heavy dependencies each internal module loads at import time, directly or through others."""
    imports = [imp for imp in imports if not imp.typing_only]
    loads: dict[str, set[str]] = {}
    for imp in imports:
        loads.setdefault(imp.source, set())
        if not imp.local and top_package(imp.target) in HEAVY:
            loads[imp.source].add(top_package(imp.target))
    grew = True
    while grew:
        grew = False
        for imp in imports:
            if not imp.local and imp.target in loads and not loads[imp.target] <= loads[imp.source]:
                loads[imp.source] |= loads[imp.target]
                grew = True
    return {module: frozenset(heavy) for module, heavy in loads.items()}


def light_local_imports(imports: list[Import]) -> list[Import]:
    """Function-local import statements that put off nothing heavy: what they load (a heavy dependency, or
    a module that loads one) is already loaded when the importing module is."""
    loads = heavy_loads(imports)
    put_off: dict[tuple[str, int], bool] = {}
    for imp in imports:
        if imp.local:
            target = loads.get(imp.target, frozenset({top_package(imp.target)}) & HEAVY)
            key = (imp.source, imp.line)
            put_off[key] = put_off.get(key, False) or not target <= loads[imp.source]
    first = {}
    for imp in imports:
        if imp.local and not put_off[(imp.source, imp.line)]:
            first.setdefault((imp.source, imp.line), imp)
    return list(first.values())


def _describe(imports: list[Import]) -> str:
    return "\n".join(f"  {imp.source}:{imp.line} -> {imp.target}" for imp in imports)


def test_no_circle_inside_a_package():
    imports = import_graph()
    found = {package: circles(imports, package) for package in PACKAGES}
    assert found == {package: [] for package in PACKAGES}


def test_imports_point_down():
    upward = [imp for imp in import_graph() if top_package(imp.target) in FORBIDDEN.get(top_package(imp.source), ())]
    assert not upward, "imports against flows -> tasks -> dpcore:\n" + _describe(upward)


def test_local_imports_only_put_off_heavy_dependencies():
    light = light_local_imports(import_graph())
    counts = {package: sum(top_package(imp.source) == package for imp in light) for package in PACKAGES}
    over = [imp for imp in light if counts[top_package(imp.source)] > LOCAL_IMPORT_BOUND[top_package(imp.source)]]
    assert all(counts[p] <= LOCAL_IMPORT_BOUND[p] for p in PACKAGES), (
        f"function-local imports of nothing heavy {counts}, bound {LOCAL_IMPORT_BOUND}:\n" + _describe(over))


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A tree of packages under `root`: {relative path: source}, an empty `__init__.py` in each folder."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    return root


def test_the_reader_sees_a_circle_a_local_import_dodges(tmp_path):
    """A circle closed only by a function-local, relative `from . import module` is found."""
    imports = import_graph(_tree(tmp_path, {"dpcore/a.py": "from dpcore.b import f\n",
                                            "dpcore/b.py": "def f():\n    from . import a\n    return a\n"}))
    assert circles(imports, "dpcore") == [["dpcore.a", "dpcore.b"]]
    assert [imp.source for imp in light_local_imports(imports)] == ["dpcore.b"]


def test_the_reader_counts_a_put_off_heavy_import_as_heavy(tmp_path):
    imports = import_graph(_tree(tmp_path, {
        "flows/flow.py": "import prefect\n",
        "flows/cli.py": "def run():\n    from flows.flow import x\n    import json\n",
        "flows/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"}))
    assert heavy_loads(imports)["flows.flow"] == {"prefect"}
    assert heavy_loads(imports)["flows.typed"] == set()
    assert [imp.target for imp in light_local_imports(imports)] == ["json"]
