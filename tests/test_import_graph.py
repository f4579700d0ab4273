"""The house's import graph, every import counted (a function's lazy import too): no package imports
another that imports it back, and the layers hold (``contract`` at the bottom, the gateway side on
``contract`` alone, the API and the dashboard at the top, nothing shipped or benchmarked imports the
tests).

A *package* here is a top-level package, or a Django app of ``outlier_admin`` (``outlier_admin.api``,
``outlier_admin.control``, ...; a module at the root of ``outlier_admin``, such as ``settings`` or
``problem``, is a package of its own)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "agent", "detector", "outlier_admin", "sim", "harness", "bench", "scripts")
#: What each package may import of this repository; a package not named may import anything but tests.
ALLOWED = {
    "contract": set(),
    "agent": {"contract"},
    "detector": {"contract"},
}
#: The top: the two faces of the control plane, and who may import each. The URL conf and the settings
#: name them (by dotted path, no import needed); no other app does: what the API and the dashboard
#: share (read models, filter sets, actions) lives in the apps below them, so the dashboard never
#: reaches into the API, nor the API into the dashboard.
IMPORTED_ONLY_BY = {
    "outlier_admin.api": {"outlier_admin.urls", "outlier_admin.settings"},
    "outlier_admin.dashboard": {"outlier_admin.urls", "outlier_admin.settings"},
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "tests":
        return "tests"
    if parts[0] not in PACKAGES:
        return None
    return ".".join(parts[:2]) if parts[0] == "outlier_admin" and len(parts) > 1 else parts[0]


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports, wherever the import statement stands, with its line."""
    module = _module(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: None if path.name == "__init__.py" else -1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, node.lineno))
            # ``from pkg import module``: the module is imported too
            found += [(f"{name}.{a.name}", node.lineno) for a in node.names if _is_module(f"{name}.{a.name}")]
    return found


def package_graph() -> dict[str, dict[str, list[str]]]:
    """``{package: {imported package: ["file:line", ...]}}``."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            src = package_of(_module(path))
            for name, line in imports_of(path):
                dst = package_of(name)
                if dst and dst != src:
                    graph[src][dst].append(f"{path.relative_to(ROOT)}:{line}")
    return graph


def circles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_lazy_imports_and_relative_ones(tmp_path: Path) -> None:
    source = ROOT / "outlier_admin" / "control" / "tasks.py"
    names = {name for name, _ in imports_of(source)}
    assert "outlier_admin.control.tick" in names  # imported inside a task function
    assert package_of("outlier_admin.control.tick") == "outlier_admin.control"
    assert package_of("outlier_admin.settings") == "outlier_admin.settings"
    assert circles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]


def test_no_package_imports_one_that_imports_it_back() -> None:
    graph = package_graph()
    found = circles(graph)
    detail = [f"{a} -> {b}: {', '.join(graph[a][b][:3])}" for c in found for a in c for b in c if b in graph[a]]
    assert found == [], "package-level import circles:\n" + "\n".join(detail)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_the_bottom_layers_import_only_what_they_may(package: str) -> None:
    graph = package_graph()
    extra = {dst: where[:3] for dst, where in graph.get(package, {}).items() if dst not in ALLOWED[package]}
    assert extra == {}, f"{package} imports {extra}"


@pytest.mark.parametrize("top", sorted(IMPORTED_ONLY_BY))
def test_the_top_is_imported_by_nothing_but_the_url_conf(top: str) -> None:
    graph = package_graph()
    found = {src: graph[src][top][:3] for src in graph if top in graph[src] and src not in IMPORTED_ONLY_BY[top]}
    assert found == {}, f"{top} is imported by {found}"


def test_nothing_but_the_tests_imports_the_tests() -> None:
    graph = package_graph()
    assert {src: graph[src]["tests"][:3] for src in graph if "tests" in graph[src]} == {}
