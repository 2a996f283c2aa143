"""The package's layers: which subpackage may import which, no import cycle, modules of a readable size.

Every import counts, function-local ones included (a deferred import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hilbert_hpc"
#: the faces at the top level: the CLI, the public API (NumPy and torch autograd), the errors
FACES = {"hilbert_hpc", "hilbert_hpc.__main__", "hilbert_hpc.cli", "hilbert_hpc.attention", "hilbert_hpc.nn",
         "hilbert_hpc.errors"}
#: layer -> the layers its modules may import (errors is a leaf every layer may use)
ALLOWED = {
    "core": {"core"},
    "distributed": {"core", "distributed"},
    "kernels": {"core", "kernels"},
    "backends": {"core", "kernels", "distributed", "backends"},
    "tools": {"core", "kernels", "backends", "tools"},
    "study": {"core", "distributed", "kernels", "backends", "study"},
}
MAX_LINES = 520


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (every import statement, at any depth)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_top_level_holds_only_the_faces():
    top = {n for n in modules() if layer(n) is None}
    assert top == FACES


def test_layers_import_only_what_they_may():
    wrong = []
    for name, deps in graph().items():
        own = layer(name)
        if own is None:
            continue
        for dep in deps:
            other = layer(dep)
            if dep == "hilbert_hpc.errors" or (other is None and dep == "hilbert_hpc"):
                continue
            if other is None or other not in ALLOWED[own]:
                wrong.append(f"{name} -> {dep}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle():
    g = graph()
    # the package itself (hilbert_hpc/__init__) only re-exports the faces; a submodule importing it for
    # __version__ is an import of the faces, not a cycle through the layers
    g = {n: {d for d in deps if d != "hilbert_hpc"} for n, deps in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                cycle = visit(d)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            cycle = visit(n)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_of_a_readable_size(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES})"


def test_the_architecture_doc_states_this_size_limit():
    import re

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    stated = re.findall(r"at most (\d+) lines", doc)
    assert stated == [str(MAX_LINES)], f"docs/architecture.md says modules stay at most {MAX_LINES} lines: {stated}"
