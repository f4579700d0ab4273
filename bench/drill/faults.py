"""Faults put on a real process: a CPU quota, SIGSTOP/SIGCONT bursts, a quota that tightens slowly.

Why these three: a gray node is slow, not dead. On a CPU-only llama.cpp server each of them is the
stand-in for an accelerator failure seen in production:

- :class:`CpuQuota` (``quota:F``): the process gets ``F`` of one core through a cgroup CPU quota (CFS
  bandwidth: ``cpu.cfs_quota_us / cpu.cfs_period_us`` on cgroup v1, ``cpu.max`` on v2). Every step of
  the engine takes ``~1/F`` longer, like a thermally throttled or power-capped GPU: the node answers,
  only slower, and its queue grows when its share of the traffic stays the same.
- :class:`Stall` (``stall:B/E``): ``SIGSTOP`` for ``B`` seconds every ``E`` seconds (then
  ``SIGCONT``): a host that freezes now and then (a noisy neighbour, page-cache stalls, an
  XID-reset-and-retry loop); between bursts the node is at full speed.
- :class:`Drift` (``drift:F/S``): the quota goes from a whole core down to ``F`` linearly over ``S``
  seconds: a slow degradation, which a detector that compares a node with its own past misses.

Every fault records its ``onset`` (wall-clock seconds, when it took effect) and ``ended``, works as a
context manager or with ``start()``/``stop()``, and always undoes itself on ``stop()``: the process
is moved back to the cgroup it came from and our cgroup is removed; a stopped process gets its
``SIGCONT``. :func:`cleanup_stale` removes cgroups a killed run left behind (a ``kill -9`` of the
drill skips every ``finally``), and only those: a cgroup is named after its maker's pid. Only pids the caller started should be given (we are root).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the cgroup hierarchies are mounted. v1's ``cpu`` controller, else a v2 unified mount that
#: has the ``cpu`` controller (``/sys/fs/cgroup`` on a pure v2 host).
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Our cgroups' name prefix (``oa-drill-<target pid>-<maker pid>``): :func:`cleanup_stale` removes
#: only these, and only when the maker is dead.
PREFIX = "oa-drill-"
#: CFS period: 100 ms is the kernel's default; the quota is a fraction of it.
PERIOD_US = 100_000
#: The kernel refuses a quota under 1 ms per period (``cpu.cfs_quota_us`` >= 1000).
MIN_QUOTA_US = 1_000
#: Bounds of a quota fraction (of one core): under 1 % the process barely runs (its HTTP server
#: would time out health checks, a dead node rather than a gray one); 64 cores is more than any
#: drill host has.
MIN_FRACTION, MAX_FRACTION = 0.01, 64.0
#: Bounds of stall bursts and drift spans (seconds): a drill is minutes long.
MAX_SPAN_S = 3600.0


class FaultError(RuntimeError):
    """The fault could not be put on (no cgroup support, no such process, a bad spec)."""


# ------------------------------------------------------------------------------------------ cgroups


@dataclass(frozen=True)
class CgroupFS:
    """One cgroup hierarchy with a CPU controller: its mount point and version (1 or 2)."""

    mount: Path
    version: int

    def quota_files(self, cg: Path) -> list[Path]:
        return [cg / "cpu.cfs_quota_us", cg / "cpu.cfs_period_us"] if self.version == 1 else [cg / "cpu.max"]

    def write_quota(self, cg: Path, fraction: float) -> None:
        quota = max(MIN_QUOTA_US, round(fraction * PERIOD_US))
        if self.version == 1:
            (cg / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (cg / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        else:
            (cg / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")

    def throttling(self, cg: Path) -> dict[str, float] | None:
        """How often the kernel held ``cg`` to its quota (``cpu.stat``): CFS periods, the periods in
        which it was throttled and the time it waited. ``None`` when the file cannot be read. A
        throttled period means the process wanted more CPU than its quota gave: the fault took."""
        try:
            stat = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines() if line.strip())
        except (OSError, ValueError):
            return None
        waited_s = (int(stat.get("throttled_time", 0)) / 1e9 if self.version == 1
                    else int(stat.get("throttled_usec", 0)) / 1e6)
        return {"periods": int(stat.get("nr_periods", 0)), "throttled_periods": int(stat.get("nr_throttled", 0)),
                "throttled_s": round(waited_s, 3)}

    def cgroup_of(self, pid: int) -> Path:
        """The cgroup ``pid`` is in, in this hierarchy (from ``/proc/<pid>/cgroup``)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError as exc:
            raise FaultError(f"no process {pid}: {exc}") from None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if (self.version == 2 and controllers == "") or (
                    self.version == 1 and "cpu" in controllers.split(",")):
                return self.mount / path.lstrip("/")
        return self.mount


def find_cgroup_fs(root: Path = CGROUP_ROOT) -> CgroupFS | None:
    """The hierarchy we can put a CPU quota in, or ``None``: v1 (``<root>/cpu`` with
    ``cpu.cfs_quota_us``), else v2 (``<root>`` or ``<root>/unified`` whose ``cgroup.controllers``
    lists ``cpu``)."""
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        if (v1 / "cpu.cfs_quota_us").exists() and (v1 / "cgroup.procs").exists():
            return CgroupFS(v1, 1)
    for v2 in (root, root / "unified"):
        try:
            if "cpu" in (v2 / "cgroup.controllers").read_text().split():
                return CgroupFS(v2, 2)
        except OSError:
            continue
    return None


def cgroup_unavailable_reason(root: Path = CGROUP_ROOT) -> str | None:
    """Why a CPU quota cannot be put on a process here (``None`` when it can): no hierarchy with a
    CPU controller, or no right to create a cgroup in it (not root, read-only mount)."""
    fs = find_cgroup_fs(root)
    if fs is None:
        return f"no cgroup hierarchy with a cpu controller under {root}"
    probe = fs.mount / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup in {fs.mount}: {exc}"
    try:
        if not all(f.exists() for f in fs.quota_files(probe)):
            if fs.version == 2:
                return f"{fs.mount}/cgroup.subtree_control does not enable cpu for children"
            return f"{probe} has no CFS quota files"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None


def _move(pid: int, cg: Path) -> None:
    (cg / "cgroup.procs").write_text(f"{pid}\n")


def _remove_cgroup(fs: CgroupFS, cg: Path, back_to: Path | None = None) -> None:
    """Move every process out of ``cg`` (to ``back_to``, else the root), then remove it."""
    try:
        pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        pids = []
    for pid in pids:
        for target in (back_to, fs.mount):
            if target is None:
                continue
            try:
                _move(pid, target)
                break
            except OSError:
                continue  # e.g. the original v2 cgroup now has children with controllers: the root
    # rmdir fails while the kernel still counts a task that is exiting: retry briefly.
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _owner_alive(name: str) -> bool:
    """Whether the process that made cgroup ``oa-drill-<target>-<owner>`` still runs. A drill and a
    test can run at once on one host (two engineers, or a test during a benchmark): each may clean
    up only what a dead process left, never another live drill's fault."""
    try:
        owner = int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return False
    if owner <= 1:
        return False
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(root: Path = CGROUP_ROOT) -> list[str]:
    """Remove the ``oa-drill-*`` cgroups whose maker has died (a ``kill -9`` of a drill skips its
    ``finally``); their processes go to the root cgroup. Returns the names removed."""
    fs = find_cgroup_fs(root)
    if fs is None:
        return []
    removed = []
    for cg in fs.mount.glob(f"{PREFIX}*"):
        if cg.is_dir() and not _owner_alive(cg.name):
            _remove_cgroup(fs, cg)
            removed.append(cg.name)
    return removed


# ------------------------------------------------------------------------------------------- faults


def _check_pid(pid: int) -> int:
    if not isinstance(pid, int) or pid <= 1:
        raise FaultError(f"pid must be a process we started (> 1), got {pid!r}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise FaultError(f"no process {pid}") from None
    return pid


def _check_fraction(fraction: float) -> float:
    f = float(fraction)
    if not MIN_FRACTION <= f <= MAX_FRACTION:
        raise FaultError(f"a CPU quota is {MIN_FRACTION} to {MAX_FRACTION} cores, got {fraction!r}")
    return f


def _check_span(value: float, what: str, lo: float = 0.05) -> float:
    v = float(value)
    if not lo <= v <= MAX_SPAN_S:
        raise FaultError(f"{what} is {lo} to {MAX_SPAN_S} s, got {value!r}")
    return v


class Fault:
    """Base: ``start()`` puts the fault on and records ``onset``; ``stop()`` undoes it (idempotent)."""

    kind = "fault"

    def __init__(self, pid: int) -> None:
        self.pid = _check_pid(pid)
        self.onset: float | None = None
        self.ended: float | None = None

    def start(self) -> Fault:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What was done and when (for the drill's JSON)."""
        return {"kind": self.kind, "pid": self.pid, "onset": self.onset, "ended": self.ended}

    def __enter__(self) -> Fault:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NoFault(Fault):
    """``none``: nothing happens at the onset (recorded as if it had): a run's floor, the same fleet,
    load and figures with every server healthy."""

    kind = "none"

    def start(self) -> NoFault:
        self.onset = time.time()
        return self

    def stop(self) -> None:
        if self.onset is not None and self.ended is None:
            self.ended = time.time()


class CpuQuota(Fault):
    """``fraction`` of one core for ``pid``, through a cgroup of its own (see module docstring).

    ``set_fraction`` changes the quota while it is on (what :class:`Drift` does)."""

    kind = "quota"

    def __init__(self, pid: int, fraction: float, *, root: Path = CGROUP_ROOT) -> None:
        super().__init__(pid)
        self.fraction = _check_fraction(fraction)
        fs = find_cgroup_fs(root)
        if fs is None:
            raise FaultError(f"no cgroup hierarchy with a cpu controller under {root}")
        self.fs = fs
        self.cgroup = fs.mount / f"{PREFIX}{pid}-{os.getpid()}"
        self.original: Path | None = None
        self.throttling: dict[str, float] | None = None  # read from cpu.stat when the fault ends
        self._lock = threading.Lock()

    def start(self) -> CpuQuota:
        with self._lock:
            if self.onset is not None:
                return self
            self.original = self.fs.cgroup_of(self.pid)
            try:
                self.cgroup.mkdir(exist_ok=True)
                if self.fs.version == 2 and not (self.cgroup / "cpu.max").exists():
                    (self.fs.mount / "cgroup.subtree_control").write_text("+cpu\n")
                self.fs.write_quota(self.cgroup, self.fraction)
                _move(self.pid, self.cgroup)
            except OSError as exc:
                _remove_cgroup(self.fs, self.cgroup, self.original)
                raise FaultError(f"cannot put a CPU quota on {self.pid} in {self.cgroup}: {exc}") from None
            self.onset = time.time()
        return self

    def set_fraction(self, fraction: float) -> None:
        with self._lock:
            self.fraction = _check_fraction(fraction)
            if self.onset is not None and self.ended is None:
                self.fs.write_quota(self.cgroup, self.fraction)

    def stop(self) -> None:
        with self._lock:
            if self.onset is None or self.ended is not None:
                return
            self.throttling = self.fs.throttling(self.cgroup)
            _remove_cgroup(self.fs, self.cgroup, self.original)
            self.ended = time.time()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "fraction": self.fraction, "cgroup": str(self.cgroup),
                "cgroup_version": self.fs.version, "throttling": self.throttling}


class Stall(Fault):
    """``SIGSTOP`` for ``burst_s`` every ``every_s`` seconds, ``SIGCONT`` in between (see module
    docstring). The first burst starts at ``start()`` (the onset); ``stop()`` always leaves the
    process running."""

    kind = "stall"

    def __init__(self, pid: int, burst_s: float, every_s: float) -> None:
        super().__init__(pid)
        self.burst_s = _check_span(burst_s, "a stall burst")
        self.every_s = _check_span(every_s, "a stall period")
        if self.burst_s >= self.every_s:
            raise FaultError(f"a stall burst ({burst_s} s) must be shorter than its period ({every_s} s)")
        self.bursts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Stall:
        if self._thread is None:
            self.onset = time.time()
            self._thread = threading.Thread(target=self._loop, name=f"stall-{self.pid}", daemon=True)
            self._thread.start()
        return self

    def _signal(self, sig: int) -> bool:
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._signal(signal.SIGSTOP):
                return
            self.bursts += 1
            self._stop.wait(self.burst_s)
            self._signal(signal.SIGCONT)
            self._stop.wait(self.every_s - self.burst_s)

    def stop(self) -> None:
        if self._thread is None or self.ended is not None:
            return
        self._stop.set()
        self._thread.join(timeout=self.every_s + 1)
        self._signal(signal.SIGCONT)  # whatever the loop was doing, the process runs again
        self.ended = time.time()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "burst_s": self.burst_s, "every_s": self.every_s, "bursts": self.bursts}


class Drift(Fault):
    """A CPU quota going linearly from ``from_fraction`` (one core) to ``to_fraction`` over
    ``over_s`` seconds, updated every ``step_s``, then held (see module docstring). The onset is
    when the quota is first put on (at ``from_fraction``: a whole core does not slow a one-thread
    engine, so the node starts slowing just after the onset)."""

    kind = "drift"

    def __init__(self, pid: int, to_fraction: float, over_s: float, *, from_fraction: float = 1.0,
                 step_s: float = 1.0, root: Path = CGROUP_ROOT) -> None:
        super().__init__(pid)
        self.from_fraction = _check_fraction(from_fraction)
        self.to_fraction = _check_fraction(to_fraction)
        self.over_s = _check_span(over_s, "a drift span", lo=1.0)
        self.step_s = _check_span(step_s, "a drift step")
        self.quota = CpuQuota(pid, self.from_fraction, root=root)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fraction_at(self, elapsed_s: float) -> float:
        """The quota ``elapsed_s`` after the onset: linear from ``from`` to ``to``, then held."""
        x = min(1.0, max(0.0, elapsed_s / self.over_s))
        return self.from_fraction + (self.to_fraction - self.from_fraction) * x

    def start(self) -> Drift:
        if self._thread is None:
            self.quota.start()
            self.onset = self.quota.onset
            self._thread = threading.Thread(target=self._loop, name=f"drift-{self.pid}", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        assert self.onset is not None
        while not self._stop.wait(self.step_s):
            self.quota.set_fraction(self.fraction_at(time.time() - self.onset))

    def stop(self) -> None:
        if self._thread is None or self.ended is not None:
            return
        self._stop.set()
        self._thread.join(timeout=self.step_s + 1)
        self.quota.stop()
        self.ended = self.quota.ended

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "from_fraction": self.from_fraction, "to_fraction": self.to_fraction,
                "over_s": self.over_s, "last_fraction": self.quota.fraction}


# --------------------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class FaultSpec:
    """A parsed ``--fault`` value: ``quota:F``, ``stall:B/E`` or ``drift:F/S`` (module docstring)."""

    kind: str
    a: float
    b: float = 0.0

    def make(self, pid: int) -> Fault:
        if self.kind == "quota":
            return CpuQuota(pid, self.a)
        if self.kind == "stall":
            return Stall(pid, self.a, self.b)
        if self.kind == "none":
            return NoFault(pid)
        return Drift(pid, self.a, self.b)

    @property
    def needs_cgroup(self) -> bool:
        return self.kind in ("quota", "drift")

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        return f"{self.kind}:{self.a:g}" + (f"/{self.b:g}" if self.kind != "quota" else "")


def parse_fault(spec: str) -> FaultSpec:
    """``quota:0.2`` | ``stall:3/10`` | ``drift:0.2/120`` | ``none``, checked against the bounds above."""
    if (spec or "").strip() == "none":
        return FaultSpec("none", 0.0)
    kind, _, rest = (spec or "").strip().partition(":")
    try:
        parts = [float(x) for x in rest.split("/")] if rest else []
    except ValueError:
        raise FaultError(f"bad fault {spec!r}: numbers expected after ':'") from None
    if kind == "quota" and len(parts) == 1:
        return FaultSpec("quota", _check_fraction(parts[0]))
    if kind == "stall" and len(parts) == 2:
        burst, every = _check_span(parts[0], "a stall burst"), _check_span(parts[1], "a stall period")
        if burst >= every:
            raise FaultError(f"bad fault {spec!r}: the burst must be shorter than the period")
        return FaultSpec("stall", burst, every)
    if kind == "drift" and len(parts) == 2:
        return FaultSpec("drift", _check_fraction(parts[0]), _check_span(parts[1], "a drift span", lo=1.0))
    raise FaultError(f"bad fault {spec!r}: quota:FRACTION, stall:BURST_S/EVERY_S drift:FRACTION/OVER_S or none")
