"""Scenario files (format version 1, ``scenarios/SCHEMA.md``): load, validate, normalise.

A scenario is a cluster (model groups of nodes), a workload per group, client behaviour, the faults
injected and the ground truth. :func:`load_scenario` turns the JSON into frozen dataclasses and
rejects bad input with :class:`ScenarioError`, whose message names the offending field as a JSON path
(``faults[1].slowdown: must be > 0, got -2``), so a typo in a 300-line file is found in one read.

Fields this simulator adds to the schema (all optional, documented in ``scenarios/SCHEMA.md``):

- ``groups[].decode_batch_curve``: ``[[batch, multiplier], ...]`` per-token decode cost against the
  number of requests running on the node (default: measured Splitwise llama2-70b/h100 curve, see
  :mod:`sim.traces`); ``"flat"`` disables it.
- ``groups[].speed_source``: ``"lognormal"`` (default, ``node_speed_spread`` is the sd of log speed) or
  ``"azure_vm_noise"`` (speed factors resampled from the measured per-VM latency offsets).
- ``client.retry_backoff_s`` (default 0): delay before a retry re-enters the gateway.
- ``tick_s`` (default 0.2): detector evaluation period for tick-based policies; ``scrape_s`` (default:
  every tick): the ``/metrics`` scrape period; ``apply_delay_s`` (default 0): a tick's weights reach
  the gateway this much later (publish + agent apply). Ticks start at a random phase (per seed).
- ``probe``: ``{"prompt_tokens": 256, "completion_tokens": 32}`` the canary request.
- ``gateway.logs_ttft`` (default true): false models a gateway whose access log has no TTFT (nginx's
  default format): detector policies then see total latency only.
- ``gateway.streams`` (default true): the gateway sees tokens as they stream (server-sent events, or
  the model server's inter-token-latency histogram); false: completed requests only.
- fault ``error_status`` (crash, default 503).
- ``groups[].engine``: the node engine (:class:`Engine`: vLLM V1 step loop by default) and the fault
  kinds ``resource``, ``kv_loss``, ``periodic_stall`` (faults as resources, ``scenarios/SCHEMA.md``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULT_KINDS = (
    "thermal_throttle",
    "sm_throttle",
    "pcie_downgrade",
    "ecc_replay",
    "kv_swap",
    "warmup",
    "crash",
    "surge",
    "drift",
    "resource",
    "kv_loss",
    "periodic_stall",
)
ENGINE_KINDS = ("vllm_v1", "per_request")


class ScenarioError(ValueError):
    """A scenario file that cannot be simulated. ``field`` is the JSON path of the bad value."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


@dataclass(frozen=True)
class TokenDist:
    """Lognormal token-count distribution: ``median * exp(sigma * N(0,1))``, rounded, in [1, max]."""

    dist: str = "lognormal"
    median: float = 1000.0
    sigma: float = 1.0
    max: int = 16000


@dataclass(frozen=True)
class Engine:
    """A node's serving engine (``groups[].engine``). ``vllm_v1``: the step loop of
    :mod:`sim.vllm` on the profile ``hardware``/``tp`` (:mod:`sim.profile`), vLLM's
    defaults; ``per_request``: the earlier model (each request's service time fixed at admission,
    ``max_concurrency`` slots), kept for tests of that formula and for comparison."""

    kind: str = "vllm_v1"
    hardware: str = "h100"
    tp: int = 8
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    kv_cache_tokens: int | None = None  # None: from GPU memory (0.9 utilisation) minus weights
    step_jitter_cv: float = 0.02


@dataclass(frozen=True)
class Group:
    name: str
    nodes: int
    prefill_ms_per_token: float
    decode_ms_per_token: float
    max_concurrency: int
    jitter_cv: float
    node_speed_spread: float
    decode_batch_curve: tuple[tuple[float, float], ...] | None = None  # None: Splitwise default
    speed_source: str = "lognormal"
    engine: Engine = Engine()


@dataclass(frozen=True)
class Workload:
    group: str
    rate_rps: float
    trace: str | None
    prompt_tokens: TokenDist
    completion_tokens: TokenDist
    rate_profile: tuple[tuple[float, float], ...] = ((0.0, 1.0),)


@dataclass(frozen=True)
class Client:
    timeout_s: float = 30.0
    retries: int = 0
    retry_backoff_s: float = 0.0


@dataclass(frozen=True)
class Fault:
    """One injected fault. ``node`` is an index in the group, or ``None`` for ``"all"`` (surge)."""

    group: str
    node: int | None
    kind: str
    start_s: float
    end_s: float | None
    params: dict[str, float] = field(default_factory=dict)

    def param(self, name: str, default: float) -> float:
        return float(self.params.get(name, default))

    def active(self, t: float) -> bool:
        return t >= self.start_s and (self.end_s is None or t < self.end_s)


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    duration_s: float
    groups: tuple[Group, ...]
    workload: tuple[Workload, ...]
    client: Client
    faults: tuple[Fault, ...]
    faulty: tuple[tuple[str, int], ...]
    no_quarantine_of_healthy: bool = True
    tick_s: float = 0.2
    scrape_s: float | None = None  # None: every tick
    apply_delay_s: float = 0.0
    probe_prompt_tokens: int = 256
    probe_completion_tokens: int = 32
    logs_ttft: bool = True
    streams: bool = True
    source: str = ""

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def without_faults(self) -> Scenario:
        """The same scenario with no fault injected (the report's ``baseline``)."""
        from dataclasses import replace

        return replace(self, faults=(), faulty=())

    def with_cadence(self, tick_s: float, scrape_s: float | None, apply_delay_s: float) -> Scenario:
        """A copy with the detector's evaluation period, the ``/metrics`` scrape period and the delay
        from a tick to the gateway applying its weights (``--cadence``)."""
        from dataclasses import replace

        return replace(self, tick_s=tick_s, scrape_s=scrape_s, apply_delay_s=apply_delay_s)

    def with_seed(self, seed: int) -> Scenario:
        from dataclasses import replace

        return replace(self, seed=seed)

    def with_duration(self, duration_s: float) -> Scenario:
        """A shortened copy (``--duration``/``--quick``): faults are kept, clipped to the new end."""
        from dataclasses import replace

        return replace(self, duration_s=float(duration_s))


# Known fault parameters: name -> (default or None when required, lower bound, strict lower bound).
_FAULT_PARAMS: dict[str, dict[str, tuple[float | None, float, bool]]] = {
    "thermal_throttle": {"slowdown": (None, 0.0, True)},
    "sm_throttle": {"slowdown": (None, 0.0, True)},
    "pcie_downgrade": {"decode_slowdown": (None, 0.0, True), "prefill_slowdown": (1.0, 0.0, True)},
    "ecc_replay": {"stall_prob": (None, 0.0, False), "stall_ms": (None, 0.0, False)},
    "kv_swap": {"swap_factor": (None, 0.0, False), "swap_threshold": (0.5, 0.0, False)},
    "warmup": {"requests": (None, 0.0, False), "slowdown": (None, 0.0, True)},
    "crash": {"error_after_ms": (5.0, 0.0, False), "error_status": (503.0, 500.0, False)},
    "surge": {"slowdown": (None, 0.0, True)},
    "drift": {"slowdown": (None, 0.0, True), "ramp_s": (None, 0.0, True)},
    "resource": {"sm_slowdown": (1.0, 0.0, True), "hbm_slowdown": (1.0, 0.0, True),
                 "net_slowdown": (1.0, 0.0, True), "host_slowdown": (1.0, 0.0, True),
                 "prefill_slowdown": (1.0, 0.0, True)},
    "kv_loss": {"fraction": (None, 0.0, False)},
    "periodic_stall": {"period_s": (None, 0.0, True), "stall_ms": (None, 0.0, False)},
}


def _num(obj: dict[str, Any], key: str, path: str, *, default: Any = ..., lo: float | None = None,
         lo_open: bool = False, hi: float | None = None, integer: bool = False) -> Any:
    """Read ``obj[key]`` as a number with bounds; errors name ``path.key``."""
    where = f"{path}.{key}" if path else key
    if key not in obj or obj[key] is None:
        if default is ...:
            raise ScenarioError(where, "required field is missing")
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScenarioError(where, f"must be a number, got {v!r}")
    if not math.isfinite(float(v)):
        raise ScenarioError(where, f"must be finite, got {v!r}")
    if integer and float(v) != int(v):
        raise ScenarioError(where, f"must be an integer, got {v!r}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ScenarioError(where, f"must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and v > hi:
        raise ScenarioError(where, f"must be <= {hi}, got {v!r}")
    return int(v) if integer else float(v)


def _flag(obj: dict[str, Any], key: str, path: str, *, default: bool) -> bool:
    v = obj.get(key, default)
    if not isinstance(v, bool):
        raise ScenarioError(f"{path}.{key}", f"must be true or false, got {v!r}")
    return v


def _one_of(value: Any, options: Any) -> bool:
    """``value in options`` for names; a list or dict (unhashable) is simply not one of them."""
    return isinstance(value, str) and value in options


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ScenarioError(where, f"must be an object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str, *, nonempty: bool = False) -> list[Any]:
    if not isinstance(v, list):
        raise ScenarioError(where, f"must be a list, got {type(v).__name__}")
    if nonempty and not v:
        raise ScenarioError(where, "must not be empty")
    return v


def _steps(v: Any, where: str, *, positive_value: bool = True) -> tuple[tuple[float, float], ...]:
    out: list[tuple[float, float]] = []
    for i, step in enumerate(_list(v, where, nonempty=True)):
        if not (isinstance(step, list) and len(step) == 2):
            raise ScenarioError(f"{where}[{i}]", "must be a [time_s, value] pair")
        a, b = step
        for x in (a, b):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise ScenarioError(f"{where}[{i}]", f"must hold two finite numbers, got {step!r}")
        if a < 0 or (positive_value and b <= 0) or (out and a <= out[-1][0]):
            raise ScenarioError(f"{where}[{i}]", f"needs increasing x >= 0 and value > 0, got {step!r}")
        out.append((float(a), float(b)))
    return tuple(out)


def _dist(v: Any, where: str) -> TokenDist:
    d = _obj(v, where)
    kind = d.get("dist", "lognormal")
    if kind != "lognormal":
        raise ScenarioError(f"{where}.dist", f"only 'lognormal' is supported, got {kind!r}")
    return TokenDist(
        dist=kind,
        median=_num(d, "median", where, lo=1.0),
        sigma=_num(d, "sigma", where, default=1.0, lo=0.0),
        max=_num(d, "max", where, default=100_000, lo=1, integer=True),
    )


def _engine(v: Any, where: str) -> Engine:
    from sim.profile import HARDWARE, TP_DEGREES

    e = _obj(v, where)
    kind = e.get("kind", "vllm_v1")
    if not _one_of(kind, ENGINE_KINDS):
        raise ScenarioError(f"{where}.kind", f"one of {', '.join(ENGINE_KINDS)}, got {kind!r}")
    hw = e.get("hardware", "h100")
    if not _one_of(hw, HARDWARE):
        raise ScenarioError(f"{where}.hardware", f"one of {', '.join(HARDWARE)}, got {hw!r}")
    tp = _num(e, "tp", where, default=8, integer=True, lo=1, hi=8)
    if tp not in TP_DEGREES:
        raise ScenarioError(f"{where}.tp", f"one of {TP_DEGREES} (the profiled degrees), got {tp}")
    known = {"kind", "hardware", "tp", "max_num_seqs", "max_num_batched_tokens", "block_size",
             "kv_cache_tokens", "step_jitter_cv", "comment"}
    unknown = sorted(set(e) - known)
    if unknown:
        raise ScenarioError(f"{where}.{unknown[0]}", f"unknown engine field (known: {sorted(known)})")
    kv = e.get("kv_cache_tokens")
    return Engine(
        kind=kind, hardware=hw, tp=tp,
        max_num_seqs=_num(e, "max_num_seqs", where, default=256, lo=1, hi=4096, integer=True),
        max_num_batched_tokens=_num(e, "max_num_batched_tokens", where, default=8192, lo=16, hi=65536,
                                    integer=True),
        block_size=_num(e, "block_size", where, default=16, lo=1, hi=256, integer=True),
        kv_cache_tokens=None if kv is None else _num(e, "kv_cache_tokens", where, lo=16, hi=10**8, integer=True),
        step_jitter_cv=_num(e, "step_jitter_cv", where, default=0.02, lo=0.0, hi=1.0),
    )


def _group(g: Any, w: str, earlier: list[Group]) -> Group:
    """``groups[i]``: a named pool of identical nodes; the name must be new (workloads and faults
    refer to groups by name), the decode batch curve is ``"flat"``, omitted (Splitwise) or steps."""
    g = _obj(g, w)
    gname = g.get("name")
    if not isinstance(gname, str) or not gname:
        raise ScenarioError(f"{w}.name", "required non-empty string")
    if any(x.name == gname for x in earlier):
        raise ScenarioError(f"{w}.name", f"duplicate group name {gname!r}")
    curve = g.get("decode_batch_curve")
    if curve == "flat":
        parsed_curve: tuple[tuple[float, float], ...] | None = ((1.0, 1.0),)
    elif curve is None:
        parsed_curve = None
    else:
        parsed_curve = _steps(curve, f"{w}.decode_batch_curve")
    speed_source = g.get("speed_source", "lognormal")
    if not _one_of(speed_source, ("lognormal", "azure_vm_noise")):
        raise ScenarioError(f"{w}.speed_source", f"'lognormal' or 'azure_vm_noise', got {speed_source!r}")
    return Group(
        engine=_engine(g.get("engine", {}), f"{w}.engine"),
        name=gname,
        nodes=_num(g, "nodes", w, lo=1, integer=True, hi=10_000),
        prefill_ms_per_token=_num(g, "prefill_ms_per_token", w, lo=0.0),
        decode_ms_per_token=_num(g, "decode_ms_per_token", w, lo=0.0, lo_open=True),
        max_concurrency=_num(g, "max_concurrency", w, lo=1, integer=True),
        jitter_cv=_num(g, "jitter_cv", w, default=0.08, lo=0.0, hi=5.0),
        node_speed_spread=_num(g, "node_speed_spread", w, default=-1.0, lo=-1.0, hi=2.0),
        decode_batch_curve=parsed_curve,
        speed_source=speed_source,
    )


def _groups(d: dict[str, Any]) -> tuple[Group, ...]:
    """``groups``: at least one, each validated by :func:`_group`, in file order."""
    groups: list[Group] = []
    for i, g in enumerate(_list(d.get("groups"), "groups", nonempty=True)):
        groups.append(_group(g, f"groups[{i}]", groups))
    return tuple(groups)


def _workload(wl: Any, w: str, names: set[str]) -> Workload:
    """``workload[i]``: the arrivals of one existing group, from a known trace (or Poisson when
    ``trace`` is omitted), with a rate profile (default: flat)."""
    from sim.traces import TRACE_NAMES

    wl = _obj(wl, w)
    if not _one_of(wl.get("group"), names):
        raise ScenarioError(f"{w}.group", f"unknown group {wl.get('group')!r} (groups: {sorted(names)})")
    trace = wl.get("trace")
    if trace is not None and not _one_of(trace, TRACE_NAMES):
        raise ScenarioError(f"{w}.trace", f"unknown trace {trace!r} (known: {sorted(TRACE_NAMES)})")
    profile = _steps(wl["rate_profile"], f"{w}.rate_profile") if wl.get("rate_profile") else ((0.0, 1.0),)
    return Workload(
        group=wl["group"],
        rate_rps=_num(wl, "rate_rps", w, lo=0.0, lo_open=True),
        trace=trace,
        prompt_tokens=_dist(wl.get("prompt_tokens", {"median": 1000}), f"{w}.prompt_tokens"),
        completion_tokens=_dist(wl.get("completion_tokens", {"median": 180}), f"{w}.completion_tokens"),
        rate_profile=profile,
    )


def _client(d: dict[str, Any]) -> Client:
    """``client``: how long a client waits, how often and how late it retries (all optional)."""
    c = _obj(d.get("client", {}), "client")
    return Client(
        timeout_s=_num(c, "timeout_s", "client", default=30.0, lo=0.0, lo_open=True),
        retries=_num(c, "retries", "client", default=0, lo=0, hi=10, integer=True),
        retry_backoff_s=_num(c, "retry_backoff_s", "client", default=0.0, lo=0.0),
    )


def _named_group(x: dict[str, Any], w: str, groups: tuple[Group, ...]) -> Group:
    """The group ``x["group"]`` names (a fault's or an expected faulty node's): one of ``groups``."""
    if not _one_of(x.get("group"), {g.name for g in groups}):
        raise ScenarioError(f"{w}.group", f"unknown group {x.get('group')!r}")
    return next(g for g in groups if g.name == x["group"])


def _fault(f: Any, w: str, groups: tuple[Group, ...]) -> Fault:
    """``faults[i]``: a known kind on one node of an existing group (``"all"`` only for a surge),
    over ``[start_s, end_s)``, with the kind's parameters (:data:`_FAULT_PARAMS`: required ones
    present, bounds held, defaults filled in) and no parameter of another kind."""
    f = _obj(f, w)
    grp = _named_group(f, w, groups)
    kind = f.get("kind")
    if not _one_of(kind, FAULT_KINDS):
        raise ScenarioError(f"{w}.kind", f"unknown kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
    node_v = f.get("node")
    if node_v == "all":
        node: int | None = None
    else:
        node = _num(f, "node", w, lo=0, hi=grp.nodes - 1, integer=True)
    if node is None and kind != "surge":
        raise ScenarioError(f"{w}.node", f"'all' is only valid for kind 'surge', not {kind!r}")
    start = _num(f, "start_s", w, default=0.0, lo=0.0)
    end = _num(f, "end_s", w, default=None, lo=0.0)
    if end is not None and end <= start:
        raise ScenarioError(f"{w}.end_s", f"must be > start_s ({start}), got {end}")
    params: dict[str, float] = {}
    for pname, (default, lo, lo_open) in _FAULT_PARAMS[kind].items():
        params[pname] = _num(f, pname, w, default=default if default is not None else ..., lo=lo,
                             lo_open=lo_open, hi=1.0 if pname in ("stall_prob", "fraction") else None)
    known = {"group", "node", "kind", "start_s", "end_s", "comment", *params}
    unknown = sorted(set(f) - known)
    if unknown:
        raise ScenarioError(f"{w}.{unknown[0]}", f"unknown parameter for kind {kind!r} "
                            f"(known: {sorted(_FAULT_PARAMS[kind])})")
    return Fault(group=f["group"], node=node, kind=kind, start_s=start, end_s=end, params=params)


def _faulty(e: dict[str, Any], groups: tuple[Group, ...]) -> tuple[tuple[str, int], ...]:
    """``expect.faulty``: the ground truth, ``(group, node)`` of nodes that exist."""
    faulty: list[tuple[str, int]] = []
    for i, x in enumerate(_list(e.get("faulty", []), "expect.faulty")):
        w = f"expect.faulty[{i}]"
        x = _obj(x, w)
        grp = _named_group(x, w, groups)
        faulty.append((x["group"], _num(x, "node", w, lo=0, hi=grp.nodes - 1, integer=True)))
    return tuple(faulty)


def parse_scenario(data: Any, source: str = "") -> Scenario:
    """Validate a decoded scenario document. Raises :class:`ScenarioError` naming the field.

    Sections are checked in file order (name, seed, duration, groups, workload, client, faults,
    expect, probe, then the cadence and gateway fields), so the first bad field is the one reported."""
    d = _obj(data, "(scenario)")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError("name", "required non-empty string")
    seed = _num(d, "seed", "", default=0, lo=0, integer=True)
    duration = _num(d, "duration_s", "", lo=0.0, lo_open=True)
    groups = _groups(d)
    names = {g.name for g in groups}
    workloads = tuple(_workload(wl, f"workload[{i}]", names)
                      for i, wl in enumerate(_list(d.get("workload"), "workload", nonempty=True)))
    client = _client(d)
    faults = tuple(_fault(f, f"faults[{i}]", groups) for i, f in enumerate(_list(d.get("faults", []), "faults")))
    e = _obj(d.get("expect", {}), "expect")
    faulty = _faulty(e, groups)
    probe = _obj(d.get("probe", {}), "probe")
    return Scenario(
        name=name,
        seed=seed,
        duration_s=duration,
        groups=groups,
        workload=workloads,
        client=client,
        faults=faults,
        faulty=faulty,
        no_quarantine_of_healthy=bool(e.get("no_quarantine_of_healthy", True)),
        tick_s=_num(d, "tick_s", "", default=0.2, lo=0.01, hi=60.0),
        scrape_s=_num(d, "scrape_s", "", default=None, lo=0.01, hi=60.0),
        apply_delay_s=_num(d, "apply_delay_s", "", default=0.0, lo=0.0, hi=60.0),
        probe_prompt_tokens=_num(probe, "prompt_tokens", "probe", default=256, lo=1, integer=True),
        probe_completion_tokens=_num(probe, "completion_tokens", "probe", default=32, lo=1, integer=True),
        logs_ttft=_flag(_obj(d.get("gateway", {}), "gateway"), "logs_ttft", "gateway", default=True),
        streams=_flag(_obj(d.get("gateway", {}), "gateway"), "streams", "gateway", default=True),
        source=source,
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises :class:`ScenarioError` (a ``ValueError``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError("(file)", f"cannot read {p}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError("(file)", f"{p} is not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return parse_scenario(data, source=str(p))
