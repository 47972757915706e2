"""The house's shape, held: no import circle inside any app, and the floors' contracts hold (issue 22).

`lint-imports` (run by scripts/test) checks the floors declared in pyproject's [tool.importlinter]; this
checks what a layers contract cannot see, a circle among modules of one floor, with the same import graph
(grimp reads every import statement, function-local ones too: a circle hidden in a function counts).
"""

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
APPS = ["clusters", "inventory", "jobs", "voltweb"]


def circles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Strongly connected groups of more than one module inside `package` (Tarjan)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.find_modules_directly_imported_by(module) & inside):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for module in modules:
        if module not in index:
            visit(module)
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*APPS, include_external_packages=False)


@pytest.mark.parametrize("app", APPS)
def test_no_import_circle_inside_an_app(graph, app):
    # A package's __init__ importing its own submodules is not a circle of the house: leave packages out.
    found = [
        group
        for group in circles(graph, app)
        if not any(a != b and b.startswith(a + ".") for a in group for b in group)
    ]
    assert not found, f"import circles in {app}: {found}"


def test_the_circle_finder_finds_one():
    graph = grimp.ImportGraph()
    for module in ("app", "app.a", "app.b", "app.c"):
        graph.add_module(module)
    graph.add_import(importer="app.a", imported="app.b")
    graph.add_import(importer="app.b", imported="app.c")
    graph.add_import(importer="app.c", imported="app.a")
    assert circles(graph, "app") == [["app.a", "app.b", "app.c"]]


def test_the_floors_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
