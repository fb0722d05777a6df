"""Planning is pure: the pure modules import no network, process or ssh library."""

from __future__ import annotations

import subprocess
import sys

PURE = [
    "dtrain.errors",
    "dtrain.plan.hosts",
    "dtrain.plan.spec",
    "dtrain.plan.planner",
    "dtrain.plan.frameworks",
    "dtrain.launch.results",
    "dtrain.launch.restarts",
    "dtrain.render",
    "dtrain.render.processes",
    "dtrain.render.doctor",
    "dtrain.processes.results",
    "dtrain.processes.launcher",
    "dtrain.processes.stackgroups",
    "dtrain.doctor.parity",
    "dtrain.doctor.judge",
]
FORBIDDEN = ["paramiko", "psutil", "subprocess", "socket", "dtrain.transport.ssh"]


def test_pure_modules_import_no_side_effect_libraries() -> None:
    code = (
        "import sys\n"
        f"for name in {PURE!r}: __import__(name)\n"
        f"print([m for m in {FORBIDDEN!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_local_launch_does_not_import_paramiko() -> None:
    code = "import sys, dtrain.cli, dtrain.launch.lifecycle; print('paramiko' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_launch_imports_nothing_only_ps_stacks_or_doctor_need() -> None:
    """What `dtrain launch` imports is on every launch's critical path (see render/__init__)."""
    only_others = [
        "dtrain.doctor.judge",
        "dtrain.processes.stackgroups",
        "dtrain.processes.results",
        "dtrain.render.doctor",
        "ctypes",  # a ProxyCommand's
        "secrets",
    ]
    code = (
        "import sys, dtrain.cli, dtrain.launch.lifecycle, dtrain.transport.ssh\n"
        f"print([m for m in {only_others!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_remote_agent_sources_are_python36_syntax() -> None:
    import ast
    from pathlib import Path

    import dtrain.remote

    for path in Path(dtrain.remote.__file__).parent.glob("*.py"):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 6))


def _imports() -> dict[str, list[tuple[str, str]]]:
    """Each dtrain module's imports from other dtrain modules, as (module, name) pairs."""
    import ast
    from pathlib import Path

    import dtrain

    root = Path(dtrain.__file__).parent
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("dtrain", *path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        package = module if is_package else module.rsplit(".", 1)[0]
        pairs = found.setdefault(module, [])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                pairs.extend((base, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                pairs.extend((alias.name, "") for alias in node.names)
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{module} imports {name} from {source}"
        for module, pairs in _imports().items()
        for source, name in pairs
        if source.startswith("dtrain") and name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


def test_packages_import_each_other_without_a_circle() -> None:
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for module, pairs in _imports().items():
        for source, _ in pairs:
            if source.startswith("dtrain.") and package(source) != package(module):
                edges.setdefault(package(module), set()).add(package(source))

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for after in edges.get(todo.pop(), ()):
                if after not in seen:
                    seen.add(after)
                    todo.append(after)
        return seen

    assert [p for p in sorted(edges) if p in reachable(p)] == []
