"""The read model sits between the control plane and its readers: ``history`` imports neither ``api``
nor ``dashboard``, ``control`` does not import ``history`` or ``api``, and the dashboard imports
nothing from ``api`` (the filter sets are the read model's too: :mod:`outlier_admin.history.filters`).
Every import counted, lazy ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "outlier_admin"


def imported(package: str) -> dict[str, set[str]]:
    """``{module path: outlier_admin modules it imports}`` of every module of ``package``."""
    out: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        out[str(path.relative_to(ROOT))] = {n for n in names if n.startswith("outlier_admin.")}
    return out


def offenders(package: str, forbidden: tuple[str, ...]) -> list[tuple[str, str]]:
    return sorted((m, n) for m, names in imported(package).items() for n in names
                  if n.split(".")[1] in forbidden)


def test_the_read_model_imports_none_of_its_readers():
    assert offenders("history", ("api", "dashboard")) == []


def test_the_control_plane_imports_neither_the_read_model_nor_the_api():
    assert offenders("control", ("history", "api", "dashboard")) == []


def test_the_dashboard_takes_nothing_from_the_api():
    assert offenders("dashboard", ("api",)) == []
