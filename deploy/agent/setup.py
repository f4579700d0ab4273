"""outlier-admin-agent, built from the repository's own source files (nothing is copied here).

The modules are listed below: the agent, the gateway client
and what it imports (``detector.states``, ``outlier_admin.fleet.names``, ``outlier_admin.keys``), and the log-format parsers
the shipper uses (with ``outlier_admin.ingest.records``, which the Envoy and OpenAI-style parsers
read timestamps with, and the records contract it checks, ``detector.records``). None of them
imports Django, Celery or numpy; tests/deploy/test_packaging.py installs the wheel in a venv that
has only redis-py and runs them.

The version and the dependencies' ranges are read from the main pyproject.toml (their one place).
Build from a checkout: ``pip install ./deploy/agent``, or ``pip wheel --no-deps -w dist ./deploy/agent``.
An sdist of this directory would hold no sources, so none is made.
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# package -> its modules; "*" is every module of the package but those in EXCLUDED.
MODULES: dict[str, list[str]] = {
    # The traffic table and the records contract (plain Python); detector/__init__ imports lazily.
    "detector": ["__init__", "records", "states"],
    "outlier_admin": ["__init__", "gateway_client", "keys", "weights_document"],  # __init__ loads Celery only when it is there
    "outlier_admin.agent": ["*"],
    "outlier_admin.fleet": ["__init__", "names"],
    "outlier_admin.ingest": ["__init__", "records"],
    "outlier_admin.ingest.logformats": ["*"],
}
# Benchmarks and test harnesses live in bench/ and tests/, never in a package: nothing to leave out.
EXCLUDED: dict[str, list[str]] = {}


def main_project() -> dict:
    path = ROOT / "pyproject.toml"
    if not path.is_file():
        raise SystemExit(f"{path} not found: build outlier-admin-agent from a checkout of the repository "
                         "(pip install ./deploy/agent), not from an sdist")
    return tomllib.loads(path.read_text())["project"]


def pinned_like_main(name: str, requirements: list[str]) -> str:
    """The requirement on ``name`` among the main project's, with its range."""
    found = [r for r in requirements if re.match(rf"{re.escape(name)}\s*([<>=!~;\[]|$)", r, re.I)]
    if len(found) != 1:
        raise SystemExit(f"expected one requirement on {name} in {ROOT / 'pyproject.toml'}, found {found}")
    return found[0]


def py_modules() -> list[str]:
    out = []
    for package, names in MODULES.items():
        folder = ROOT.joinpath(*package.split("."))
        if names == ["*"]:
            names = sorted(p.stem for p in folder.glob("*.py") if p.stem not in EXCLUDED.get(package, []))
        for name in names:
            if not (folder / f"{name}.py").is_file():
                raise SystemExit(f"{package}.{name}: no such module under {ROOT}")
            out.append(f"{package}.{name}")
    return out


project = main_project()
runtime = project["dependencies"]

# A fresh build directory and egg-info for every build, outside the tree: a module dropped from the
# list above cannot linger in a stale build/lib and end up in the next wheel.
scratch = tempfile.mkdtemp(prefix="outlier-admin-agent-build-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)

setup(
    version=project["version"],
    install_requires=[pinned_like_main("redis", runtime)],
    extras_require={
        "metrics": [pinned_like_main("prometheus-client", runtime)],  # --metrics-port
        "orjson": [pinned_like_main("orjson", runtime)],  # the log parsers' fast path
    },
    long_description=(ROOT / "outlier_admin" / "agent" / "README.md").read_text(),
    long_description_content_type="text/markdown",
    package_dir={"": "../.."},  # ROOT, relative: setuptools refuses absolute paths
    py_modules=py_modules(),
    options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}},
)
