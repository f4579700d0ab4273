"""``manage.py`` and the installed ``outlier-admin`` (the same function) run without their environment
say in one line what to set, not a traceback: no DJANGO_DEBUG / SECRET_KEY (ImproperlyConfigured),
and an unmigrated database (``no such table``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    # A clean environment: not the suite's (which marks itself as a test run).
    base = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**base, **env})


@pytest.mark.parametrize("entry", [[str(ROOT / "manage.py")], ["-m", "outlier_admin.cli"]])
def test_without_the_environment_one_line_says_what_to_set(entry, tmp_path):
    done = run([*entry, "showmigrations"], {}, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "SECRET_KEY must be set" in line and "DJANGO_DEBUG=1" in line and "DATABASE_URL" in line


@pytest.mark.parametrize("entry", [[str(ROOT / "manage.py")], ["-m", "outlier_admin.cli"]])
def test_an_unmigrated_database_says_to_migrate(entry, tmp_path):
    env = {"DJANGO_DEBUG": "1", "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}"}
    done = run([*entry, "create_group", "g1"], env, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "has no tables (no such table: fleet_modelgroup)" in line and "run `migrate` first" in line
    # With --traceback, Django's own traceback.
    assert "Traceback" in run([*entry, "create_group", "g1", "--traceback"], env, tmp_path).stderr
