"""One drill, and the matrix of drills: engines, gateway, control plane, load, fault, figures.

A drill (:func:`run_drill`), in this order, everything on 127.0.0.1 and stopped by pid at the end:

1. ``servers`` llama.cpp engines (:mod:`.engines`) and a group ``drill-<hex>`` with one node each
   (``metrics_url`` set), created through the operator's actions;
2. the gateway (:mod:`.gateways`), the control plane's processes (:mod:`.control_plane`) and, with
   ``weights=True``, the agent applying the published weights to that gateway;
3. the Poisson load (:mod:`.load`) for ``onset_s + after_s`` seconds; at ``onset_s`` the fault
   (:mod:`.faults`) is put on the faulty engine's pid and stays until the end;
4. the figures (:mod:`.report`) from the client's records, the group's transitions in PostgreSQL and
   the published documents; the host's load average at the start, the onset and the end, since the
   machine is shared and a drill on a busy host measures the host too.

The matrix (:func:`run_matrix`) runs every gateway with and without the agent applying the weights
(``off``: the control plane still runs, decides and publishes; nobody applies it), same seed, so the
only difference between a pair is whether the gateway followed the weights.

Any part that dies (an engine, the worker, the scraper, the tailer, the agent) ends the drill with an
error naming it and its last log lines: figures from a half-running control plane mean nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.drill import engines as engines_mod
from bench.drill import faults as faults_mod
from bench.drill import gateways as gateways_mod
from bench.drill.control_plane import ROOT, ControlPlane, WeightsWatcher, new_group_name
from bench.drill.load import TIMEOUT_S, PoissonLoad
from bench.drill.report import summarise
from contract import keys
from harness.gateways import make_workdir

#: Bounds of a drill's shape (a drill is minutes on a 2-core host, never hours).
MAX_SERVERS = 16
MAX_PHASE_S = 1800.0
#: Seconds between liveness checks of the drill's processes.
ALIVE_EVERY_S = 5.0


class DrillUnavailable(RuntimeError):
    """This host cannot run the drill (no llama.cpp package, no gateway binary, no cgroup)."""


class DrillFailed(RuntimeError):
    """A part of the drill died while it ran."""


@dataclass
class DrillConfig:
    gateway: str = "nginx-rr"
    weights: bool = True
    fault: str = "quota:0.2"
    servers: int = 5
    rate: float = 1.2
    onset_s: float = 60.0
    after_s: float = 120.0
    seed: int = 1
    timeout_s: float = TIMEOUT_S
    faulty: str | None = None  # engine name (s0..); default: the last one
    thresholds: dict[str, Any] = field(default_factory=dict)
    tick_ms: int | None = None
    keep_workdir: bool = False
    #: Canary probes; ``None``: only when the weights are applied (a probe of the throttled node in the
    #: router-alone arm would add work to it that the router alone never sends: an unfair arm).
    canaries: bool | None = None

    def __post_init__(self) -> None:
        if self.canaries is None:
            self.canaries = self.weights

    def check(self) -> faults_mod.FaultSpec:
        if self.gateway not in gateways_mod.GATEWAYS:
            raise ValueError(f"gateway is one of {gateways_mod.GATEWAYS}, got {self.gateway!r}")
        if not 2 <= self.servers <= MAX_SERVERS:
            raise ValueError(f"servers: 2 to {MAX_SERVERS} (a peer comparison needs peers), got {self.servers}")
        for what, v in (("onset", self.onset_s), ("after", self.after_s)):
            if not 1.0 <= v <= MAX_PHASE_S:
                raise ValueError(f"{what}: 1 to {MAX_PHASE_S} s, got {v}")
        if self.faulty is not None and self.faulty not in {f"s{i}" for i in range(self.servers)}:
            raise ValueError(f"faulty is one of s0..s{self.servers - 1}, got {self.faulty!r}")
        return faults_mod.parse_fault(self.fault)


def unavailable_reason(cfg: DrillConfig) -> str | None:
    """Why this host cannot run ``cfg`` (``None`` when it can)."""
    spec = cfg.check()
    reason = engines_mod.unavailable_reason() or gateways_mod.unavailable_reason(cfg.gateway)
    if reason is None and spec.needs_cgroup:
        reason = faults_mod.cgroup_unavailable_reason()
    return reason


def child_database_url() -> str:
    """A URL for the children that points at the database this process's Django uses (in tests:
    pytest-django's test database, not the one DATABASE_URL names)."""
    from django.db import connection

    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def source_state() -> dict[str, Any]:
    """The commit and the modified files of the work tree the drill ran: the figures belong to that
    code (several people edit one tree; a drill between two of their saves measures a mix)."""
    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10,
                                  check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "modified": git("status", "--short", "-uno").splitlines()[:100]}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class _Drill:
    """One drill's parts, ``None`` until they start, and what it records on the way. Each step of
    the module docstring is a method, called in that order by :func:`run_drill`; :meth:`stop` stops
    whatever started, whichever step failed."""

    cfg: DrillConfig
    spec: faults_mod.FaultSpec
    group: str
    workdir: Path
    redis_url: str
    host: dict[str, Any]
    log: Any
    fleet: Any = None
    faulty: Any = None
    cp: Any = None
    gateway: Any = None
    watcher: Any = None
    meter: Any = None
    fault: Any = None

    def start_servers(self) -> None:
        """1. The llama.cpp engines; ``faulty`` is the one the fault will strike (``cfg.faulty``, or
        the last)."""
        cfg = self.cfg
        faulty_name = cfg.faulty or f"s{cfg.servers - 1}"
        self.fleet = engines_mod.EngineFleet(cfg.servers, self.workdir / "engines")
        self.faulty = self.fleet.by_name(faulty_name)
        self.log(f"[drill] {cfg.servers} llama.cpp servers up: {self.fleet.addresses}; faulty {faulty_name} "
                 f"({self.faulty.address})")

    def set_up_group(self) -> None:
        """1. The group, one node per engine (``metrics_url`` set), through the operator's actions, in
        the database the children will use."""
        self.cp = ControlPlane(self.workdir / "control", self.group,
                               {s.name: (s.address, s.metrics_url) for s in self.fleet.servers},
                               database_url=child_database_url(), redis_url=self.redis_url,
                               thresholds=self.cfg.thresholds, tick_ms=self.cfg.tick_ms)
        self.cp.setup()

    def start_gateway_and_control_plane(self) -> None:
        """2. The gateway, then the control plane's processes (the log tailer follows the gateway's
        access log), and with the weights on, the agent applying them to the gateway (LiteLLM's
        callback reads the weights itself: no agent)."""
        cfg = self.cfg
        self.gateway = gateways_mod.start_gateway(cfg.gateway, self.workdir / "gateway", self.fleet.addresses,
                                                  self.group, weights=cfg.weights, redis_url=self.redis_url)
        self.cp.start(self.gateway, canaries=cfg.canaries)
        if cfg.weights and cfg.gateway != "litellm":  # LiteLLM's callback reads the weights itself
            self.cp.start_agent(self.gateway)

    def start_recorders(self, r: Any) -> None:
        """What the figures are made of besides the client's records: the published documents
        (``watcher``) and every engine's token counters (``meter``, first snapshot now)."""
        self.watcher = WeightsWatcher(r, self.group)
        self.meter = engines_mod.TokenMeter(self.fleet.ports, pids=self.fleet.pids)
        self.meter.snapshot("start")

    def run_load(self) -> tuple[PoissonLoad, list[Any]]:
        """3. The Poisson load for ``onset_s + after_s`` s; at ``onset_s`` the fault on the faulty
        engine's pid (:meth:`on_tick`). A part found dead stops the load and fails the drill."""
        cfg, gateway = self.cfg, self.gateway
        load = PoissonLoad(gateway.url, rate=cfg.rate, duration_s=cfg.onset_s + cfg.after_s, seed=cfg.seed,
                           timeout_s=cfg.timeout_s, served_by=gateway.served_by, header=gateways_mod.SERVED_BY,
                           headers=getattr(gateway, "request_headers", None))
        self.log(f"[drill] group {self.group}, {cfg.gateway} at {gateway.url}, weights {'on' if cfg.weights else 'off'}, "
                 f"{len(load.offsets)} requests over {cfg.onset_s + cfg.after_s:.0f} s, fault {self.spec} at +{cfg.onset_s:.0f} s")
        state: dict[str, Any] = {"next_check": ALIVE_EVERY_S, "dead": []}
        requests = load.run(lambda elapsed: self.on_tick(elapsed, load, state))
        if state["dead"]:
            raise DrillFailed("a part of the drill died: " + " | ".join(state["dead"]))
        return load, requests

    def on_tick(self, elapsed: float, load: PoissonLoad, state: dict[str, Any]) -> None:
        """The load's clock: the fault starts at the onset (with the host's load and a token snapshot
        then), and every :data:`ALIVE_EVERY_S` each process is checked (``state["dead"]``)."""
        if self.fault is None and elapsed >= self.cfg.onset_s:
            self.host["loadavg_onset"] = _load()
            self.meter.snapshot("onset")
            self.fault = self.spec.make(self.faulty.pid).start()
            self.log(f"[drill] +{elapsed:.1f} s: {self.spec} on {self.faulty.name} (pid {self.faulty.pid})")
        if elapsed >= state["next_check"]:
            state["next_check"] += ALIVE_EVERY_S
            dead = self.cp.check_alive() + [f"engine {s.name} exited" for s in self.fleet.servers
                                            if s.proc is None or s.proc.poll() is not None]
            if dead:
                state["dead"] = dead
                load.stop()

    def collect(self, load: PoissonLoad, requests: list[Any], source: dict[str, Any], t_wall: float
                ) -> dict[str, Any]:
        """4. The figures (:func:`~bench.drill.report.summarise`) from the client's records, the
        group's transitions and probes in PostgreSQL and the published documents, and the result:
        everything the figures were made of."""
        cfg, fault, meter, faulty = self.cfg, self.fault, self.meter, self.faulty
        assert fault is not None and fault.onset is not None and load.started_at is not None
        meter.snapshot("end")  # before the fault ends: every request sent has ended by now
        meter.stop()
        fault.stop()  # the load is over: the fault ends here, and its record says when
        end = load.started_at + cfg.onset_s + cfg.after_s
        time.sleep(2.0)  # the last tick's transitions reach PostgreSQL
        self.host["loadavg_end"] = _load()
        transitions = self.cp.transitions()
        probes = self.cp.probes()
        addresses = self.fleet.addresses
        figures = summarise(requests=[q.to_dict() for q in requests], transitions=transitions,
                            weights_changes=self.watcher.changes, onset=fault.onset, end=end, faulty=faulty.address,
                            addresses=list(addresses.values()), token_samples=meter.samples,
                            faulty_name=faulty.name, probes=probes, names=addresses)
        return {
            "config": asdict(cfg), "group": self.group, "host": self.host, "source": source,
            "faulty": {"name": faulty.name, "address": faulty.address},
            "servers": addresses, "gateway": self.gateway.describe(), "fault": fault.describe(),
            "load_started_at": load.started_at, "figures": figures, "ingest": self.cp.ingest_counts(),
            "weights_documents_seen": self.watcher.documents, "transitions": transitions,
            "weights_changes": self.watcher.changes, "token_samples": meter.samples, "probes": probes,
            "requests": [q.to_dict() for q in requests],
            "wall_s": round(time.time() - t_wall, 1),
        }

    def stop(self) -> None:
        """The fault first (the engine runs free again), the engines last."""
        for part in (self.fault, self.watcher, self.meter, self.cp, self.gateway, self.fleet):
            if part is not None:
                part.stop()


def host_boot() -> str | None:
    """This boot of the host (Linux's ``boot_id``): runs of one boot ran on the same machine as it then
    was, so the tables compare a router's two arms run for run only within one boot (a restart can
    bring another CPU: the healthy minute's P50 moved from 0.6-0.9 s to 0.9-1.1 s across one)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def run_drill(cfg: DrillConfig, *, log: Any = print) -> dict[str, Any]:
    """One drill (module docstring); Django must be set up. Returns the JSON-able result."""
    from django.conf import settings

    from outlier_admin.control.redis_conn import client_for

    spec = cfg.check()
    reason = unavailable_reason(cfg)
    if reason:
        raise DrillUnavailable(reason)
    faults_mod.cleanup_stale()
    workdir = make_workdir("oa-drill-")
    group = new_group_name()
    r = client_for(settings.REDIS_URL)
    drill = _Drill(cfg, spec, group, workdir, settings.REDIS_URL,
                   {"cpus": os.cpu_count(), "boot": host_boot(), "loadavg_start": _load()}, log)
    source = source_state()
    t_wall = time.time()
    try:
        drill.start_servers()
        drill.set_up_group()
        drill.start_gateway_and_control_plane()
        drill.start_recorders(r)
        load, requests = drill.run_load()
        return drill.collect(load, requests, source, t_wall)
    finally:
        drill.stop()
        faults_mod.cleanup_stale()
        r.delete(keys.weights(group), keys.legacy_weights(group), keys.applied(group))
        if not cfg.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"[drill] workdir kept: {workdir}")


def row(result: dict[str, Any]) -> dict[str, Any]:
    """The table row of one run (what ``python -m bench.drill`` prints)."""
    f, c = result["figures"], result["config"]
    after = f["latency_after_onset"]
    return {
        "gateway": c["gateway"], "weights": "on" if c["weights"] else "off", "fault": c["fault"],
        "cut_s": f["onset_to_first_cut_s"], "quarantine_s": f["onset_to_quarantine_s"],
        "busy_s": f.get("faulty_busy_from_s"),
        "false_cuts": f["false_cuts"], "false_q": f["false_quarantines"],
        "p50_s": after["p50_s"], "p99_s": after["p99_s"], "timeouts": after["timeouts"], "n_after": after["n"],
        "share_before": f["faulty_share_before"], "share_after": f["faulty_share_after"],
        "share_after_cut": f["faulty_share_after_cut"],
        "load_1m": [result["host"].get("loadavg_start", [None])[0], result["host"].get("loadavg_onset", [None])[0],
                    result["host"].get("loadavg_end", [None])[0]],
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = [("gateway", 9), ("weights", 7), ("busy_s", 6), ("cut_s", 7), ("quarantine_s", 12), ("false_cuts", 10), ("false_q", 7),
            ("p50_s", 7), ("p99_s", 7), ("timeouts", 8), ("n_after", 7), ("share_before", 12), ("share_after", 11),
            ("share_after_cut", 15), ("load_1m", 18)]

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, list):
            return "/".join("-" if x is None else f"{x:g}" for x in v)
        return f"{v:g}" if isinstance(v, float) else str(v)

    lines = ["  ".join(name.ljust(w) for name, w in cols)]
    for rw in rows:
        lines.append("  ".join(cell(rw.get(name)).ljust(w) for name, w in cols))
    return "\n".join(lines)


def run_matrix(base: DrillConfig, gateways: tuple[str, ...] = gateways_mod.GATEWAYS, *,
               log: Any = print) -> list[dict[str, Any]]:
    """Every gateway with the weights off, then on (same seed and fault); a run that fails is kept
    as its error so the others still count."""
    results = []
    for gw in gateways:
        for weights in (False, True):
            cfg = DrillConfig(**{**asdict(base), "gateway": gw, "weights": weights, "canaries": None})
            try:
                results.append(run_drill(cfg, log=log))
            except (DrillFailed, TimeoutError, RuntimeError) as exc:
                log(f"[drill] {gw} weights {'on' if weights else 'off'} failed: {exc}")
                results.append({"config": asdict(cfg), "error": str(exc)[:4000]})
    return results


def write_report(report: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return path
