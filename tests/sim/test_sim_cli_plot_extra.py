"""``python -m sim run ... --plot`` in a venv without the ``sim`` extra (the demo's) ran its
simulation for minutes and then failed on ``import matplotlib``; it now exits 2 at once naming
``pip install -e '.[sim]'``, before any work or output file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def without_matplotlib(tmp_path) -> dict[str, str]:
    """The environment of a venv where ``import matplotlib`` fails, as without the extra: a package
    of that name first on the path that raises what a missing one raises."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}


@pytest.mark.parametrize("argv", [
    ["run", "scenarios/seed-drill-32.json", "--out", "{out}/r.json", "--plot", "{out}/r.png",
     "--seeds", "1", "--duration", "5", "--policies", "round_robin", "--quiet"],
    ["suite", "scenarios", "--out", "{out}/suite", "--quick", "--seeds", "1", "--quiet"],
], ids=["run --plot", "suite"])
def test_a_missing_sim_extra_stops_the_command_at_once(argv, tmp_path, without_matplotlib):
    out = tmp_path / "out"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sim", *(a.format(out=out) for a in argv)], cwd=ROOT,
                          env=without_matplotlib, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "pip install -e '.[sim]'" in proc.stderr and "matplotlib" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # nothing simulated, nothing written
    assert time.monotonic() - started < 30  # a hang guard: nothing simulated (a run takes minutes)


def test_run_without_plot_needs_no_matplotlib(tmp_path, without_matplotlib):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "scenarios/seed-drill-32.json", "--out",
                           str(out), "--seeds", "1", "--duration", "5", "--policies", "round_robin", "--quiet"],
                          cwd=ROOT, env=without_matplotlib, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file()
