"""outlier-admin-agent, built from the repository's own source files (nothing is copied here).

The distribution is two packages, found, not listed: ``agent`` (the agent, the gateway client, the
log shipper) and ``contract`` (what the control plane and the gateways share: key names, the weights
document, the traffic table, names, the record contract and the log formats, the Redis topology).
Neither imports Django, Celery or numpy, nor any other package of the repository;
tests/deploy/test_packaging.py installs the wheel in a venv that has only redis-py and imports every
module of it.

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

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: The packages shipped, each with its subpackages.
PACKAGES = ["agent", "contract"]


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


project = main_project()
runtime = project["dependencies"]

# A fresh build directory and egg-info for every build, outside the tree: a module removed from the
# source cannot linger in a stale build/lib and end up in the next wheel.
scratch = tempfile.mkdtemp(prefix="outlier-admin-agent-build-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)

setup(
    version=project["version"],
    install_requires=[pinned_like_main("redis", runtime)],
    extras_require={
        "metrics": [pinned_like_main("prometheus-client", runtime)],  # --metrics-port
        "orjson": [pinned_like_main("orjson", runtime)],  # the log parsers' fast path
    },
    long_description=(ROOT / "agent" / "README.md").read_text(),
    long_description_content_type="text/markdown",
    package_dir={"": "../.."},  # ROOT, relative: setuptools refuses absolute paths
    packages=find_packages(str(ROOT), include=[f"{p}{tail}" for p in PACKAGES for tail in ("", ".*")]),
    options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}},
)
