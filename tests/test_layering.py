"""The package's shape, checked from its source: imports flow one way, privates stay private.

Layers, lowest first: `plan` (pure; with `errors` and the agent's stdlib-only `remote.proto`),
`transport`, `agents`, then `processes`, `doctor` and `launch` (in that order: launch may use
doctor's preflight and the process sweep, never the reverse), then `render` and `cli`. A module
may import its own layer or a lower one; nothing imports `cli`; there is no import circle, not even
through an import inside a function. Type-only imports (`if TYPE_CHECKING:`) are left out: they
never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dtrain"
LONGEST_FUNCTION_LINES = 80

# The layer of each top-level part of dtrain; a module may import only its layer or below.
LAYERS = {
    "errors": 0,
    "remote": 0,
    "plan": 0,
    "__init__": 0,
    "inputfiles": 0,
    "containers": 0,
    "transport": 1,
    "agents": 2,
    "processes": 3,
    "doctor": 4,
    "launch": 5,
    "render": 6,
    "flags": 7,  # the command line's shared flags, and where a command runs: cli's own parts
    "where": 7,
    "launchflags": 7,
    "cli": 7,
    "__main__": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in PACKAGE.rglob("*.py")}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: module level and inside functions, not `if TYPE_CHECKING:`."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            yield node


def imported_modules(
    name: str, node: ast.Import | ast.ImportFrom, known: set[str]
) -> Iterator[str]:
    """The dtrain modules an import statement loads (`from dtrain.x import y` loads x.y if y is
    a module)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.startswith("dtrain"))
        return
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package(name) else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base]) if base else ".".join(package)
    if not base.startswith("dtrain"):
        return
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        yield candidate if candidate in known else base


def is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    return {
        name: {
            target
            for node in runtime_imports(tree)
            for target in imported_modules(name, node, known)
            if target != name and target in known
        }
        for name, tree in trees.items()
    }


def test_imports_flow_down_the_layers() -> None:
    wrong = [
        f"{src} imports {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if LAYERS[part_of(dst)] > LAYERS[part_of(src)]
    ]
    assert wrong == []


def test_plan_imports_only_itself_errors_and_the_protocol() -> None:
    allowed = {"dtrain", "dtrain.errors", "dtrain.remote", "dtrain.remote.proto"}
    wrong = [
        f"{src} imports {dst}"
        for src, targets in import_graph().items()
        if part_of(src) == "plan"
        for dst in targets
        if part_of(dst) != "plan" and dst not in allowed
    ]
    assert wrong == []


def test_there_is_no_import_circle() -> None:
    graph = import_graph()
    circles = []
    for start in graph:
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


def test_no_module_imports_another_modules_private_name() -> None:
    wrong = [
        f"{name} imports {node.module}.{alias.name}"
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dtrain")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert wrong == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_functions_are_shorter_than_a_screen(name: str) -> None:
    tree = modules()[name]
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 >= LONGEST_FUNCTION_LINES
    ]
    assert long == []
