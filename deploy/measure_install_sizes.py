"""Installed size of outlier-admin's runtime and of each extra, each in a fresh virtual environment.

``python deploy/measure_install_sizes.py --out reports/install-sizes.json`` (``make install-sizes``)
builds the wheel once, then for every configuration creates a venv, installs it and measures what the
install added: the bytes of ``site-packages`` (files, not blocks) and the distributions installed.
Configurations:

* ``runtime``   ``pip install outlier-admin``: the control plane (web, worker, beat)
* ``agent``     ``pip install outlier-admin-agent`` (its wheel, built from ``deploy/agent``; redis-py from
  the index): a gateway host
* ``sim``, ``demo``  runtime + that extra; ``all-extras`` runtime + sim + demo, which is exactly
  what ``pip install .`` installed before the extras were split out (matplotlib and fakeredis were
  runtime dependencies)

Prints one line per configuration and writes JSON. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def _bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            p = Path(dirpath, name)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def _distributions(venv: Path) -> list[str]:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                         check=True, capture_output=True, text=True)
    return sorted(d["name"].lower() for d in json.loads(out.stdout))


def measure(name: str, installs: list[list[str]], workdir: Path) -> dict:
    """Create a venv, run each ``pip install`` argument list in it, and measure what they added."""
    venv = workdir / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = _site_packages(venv)
    base_bytes, base_dists = _bytes(site), set(_distributions(venv))
    started = time.monotonic()
    for args in installs:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *args], check=True)
    added = sorted(set(_distributions(venv)) - base_dists)
    return {"name": name, "mb": round((_bytes(site) - base_bytes) / 1e6, 1), "packages": len(added),
            "distributions": added, "install_s": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/install-sizes.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="oa-sizes-") as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"), str(ROOT)],
                       check=True)
        wheel = str(next((work / "dist").glob("outlier_admin-*.whl")))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"),
                        str(ROOT / "deploy" / "agent")], check=True)
        agent_wheel = str(next((work / "dist").glob("outlier_admin_agent-*.whl")))
        configs = {
            "runtime": [[wheel]],
            "agent": [[agent_wheel]],
            "sim": [[f"{wheel}[sim]"]],
            "demo": [[f"{wheel}[demo]"]],
            "all-extras": [[f"{wheel}[sim,demo]"]],
        }
        results = []
        for name, installs in configs.items():
            r = measure(name, installs, work)
            results.append(r)
            print(f"{name:11s} {r['mb']:7.1f} MB  {r['packages']:3d} packages  ({r['install_s']} s)", flush=True)
    runtime = next(r for r in results if r["name"] == "runtime")
    for r in results:
        r["mb_over_runtime"] = round(r["mb"] - runtime["mb"], 1)
    report = {"python": platform.python_version(), "platform": platform.platform(), "configs": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
