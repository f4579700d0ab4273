"""List the functions longer than a limit (80 lines by default) outside the tests: ``python
scripts/long_functions.py [--limit N] [PATH ...]``. Exit status 1 when there is one; ``--allow`` names
functions left alone on purpose (``file:qualname``)."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "agent", "detector", "outlier_admin", "sim", "bench", "harness", "scripts", "deploy")


def long_functions(paths: list[Path], limit: int) -> list[tuple[int, str]]:
    """``[(lines, "file:line qualname")]`` of every function over ``limit`` lines, longest first."""
    found = []
    for path in paths:
        if "migrations" in path.parts:
            continue
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        todo: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text(), str(path)), "")]
        while todo:
            node, prefix = todo.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    lines = child.end_lineno - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and lines > limit:
                        found.append((lines, f"{where}:{child.lineno} {name}"))
                    todo.append((child, name + "."))
    return sorted(found, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--allow", action="append", default=[], metavar="FILE:QUALNAME")
    args = parser.parse_args(argv)
    roots = [p.resolve() for p in args.paths] or [ROOT / p for p in PACKAGES]
    paths = sorted(p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py")))
    found = [(n, where) for n, where in long_functions(paths, args.limit)
             if f"{where.split(':')[0]}:{where.split(' ')[1]}" not in args.allow]
    for n, where in found:
        print(f"{n:5d}  {where}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
