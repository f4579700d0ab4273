"""Discrete-event simulation of an inference cluster behind a gateway (one policy, one run).

Nodes run vLLM V1's step loop (:mod:`sim.vllm`, step times from :mod:`sim.profile`)
unless their group selects ``engine.kind: per_request``; faults then act on the node's resources
(:meth:`Simulation.node_state`, table in ``scenarios/SCHEMA.md``), and the streamed progress a policy
gets is the engine's inter-token counters. The rest of this docstring describes the per-request model.

Per-request model (per node, ``scenarios/SCHEMA.md`` plus the calibrations below):

- A node runs at most ``max_concurrency`` requests; further requests wait in a FIFO queue.
- Service time of a request that starts with ``b`` requests running (itself included)::

      prefill = prefill_ms_per_token * N_prompt * speed * noise * F_prefill(t)
      decode  = decode_ms_per_token * g(b) * N_completion * speed * noise * F_decode(t) [+ stall_ms]
      TTFT    = queue wait + prefill + decode / N_completion      (first token)
      total   = queue wait + prefill + decode

  ``speed`` is drawn once per node (lognormal, sd of log = ``node_speed_spread``; default from the
  Azure VM-noise across-VM spread), ``noise`` per request (lognormal with mean 1 and coefficient of
  variation ``jitter_cv``), ``g(b)`` the measured Splitwise decode-vs-batch curve normalised at b=1
  and rescaled to 1 at ``b = max_concurrency`` (the scenario's ``decode_ms_per_token`` is the cost at a
  full batch; an idle node is faster by the measured ratio), ``F`` the fault factors.
- Step faults (thermal throttle, PCIe downgrade, surge, drift in 1 s steps) also stretch the remaining
  work of requests already running when they start or end, as a real throttle would.
- ``crash``: every request gets ``error_status`` after ``error_after_ms``; running and queued requests
  fail at the crash.

Streaming (``gateway.streams``, default true): tokens leave a node as they are decoded, at the
request's current per-token time (a fault edge changes it from the edge on; an ECC stall is spread
over the request's tokens, as recurring replays are). A tick-based policy that ``wants_progress`` gets,
per node and tick, the tokens streamed during the tick and the inter-token time they took, exactly
(piecewise-constant rates integrated per attempt), like an inter-token-latency histogram's
``_count``/``_sum`` deltas. A request the client abandoned streams no more.

Gateway: each attempt is logged like an access-log line when it completes (``status`` 200 or the
error), or at ``arrival + timeout_s`` with status 0 and ``total = timeout`` when the client gives up
first. The node keeps working on an abandoned request (wasted capacity). A failed attempt is retried
(``client.retries`` times, after ``retry_backoff_s``) through the gateway, i.e. re-routed by the policy.

Speed: base arrivals are read from precomputed arrays (no heap push); the heap holds completions,
retries, ticks and fault edges; timeouts are a FIFO (all attempts share one timeout, so deadlines are
in dispatch order) drained before each event, which keeps them exact at O(1) per attempt.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sim.profile import HEALTHY, Resources, step_model, throttle_factor
from sim.scenario import Fault, Scenario
from sim.traces import healthy_vm_offsets, splitwise_decode_curve, vm_noise_spread
from sim.vllm import NodeEngine, NodeSettings, scrape_page
from sim.workload import Requests

EV_RETRY, EV_COMPLETE, EV_TICK, EV_EDGE, EV_JOIN, EV_NODE, EV_STALL, EV_OBSERVE = 0, 1, 2, 3, 4, 5, 6, 7
KV_SWAP_TOKENS_PER_SLOT = 2048  # kv_swap on the step engine: capacity = threshold * slots * this
KIND_CLIENT, KIND_PROBE = 0, 1
STATUS_OK, STATUS_TIMEOUT = 200, 0
DRIFT_STEP_S = 1.0


def decode_curve_table(curve: tuple[tuple[float, float], ...] | None, max_batch: int) -> list[float]:
    """``g(b)`` for b = 0..max_batch, linear interpolation (and extrapolation past the last point),
    normalised to 1 at ``b = max_batch - 1`` (the group's ``max_concurrency``)."""
    pts = curve if curve is not None else splitwise_decode_curve()
    xs = np.asarray([p[0] for p in pts])
    ys = np.asarray([p[1] for p in pts])
    b = np.arange(max_batch + 1, dtype=np.float64)
    out = np.interp(b, xs, ys)
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        past = b > xs[-1]
        out[past] = ys[-1] + slope * (b[past] - xs[-1])
    out[b < xs[0]] = ys[0]
    # The scenario's decode_ms_per_token is the cost at a full batch (max_concurrency running): lighter
    # batches are faster by the measured ratio, so a saturated node serves exactly the schema's cost.
    ref = out[min(max_batch - 1, len(out) - 1)]
    return (out / ref).tolist()


def node_speeds(scn: Scenario, rng: np.random.Generator) -> list[np.ndarray]:
    """Per-group arrays of per-node speed factors (multiplying service time)."""
    out = []
    default_spread = vm_noise_spread()["across"]
    for g in scn.groups:
        if g.speed_source == "azure_vm_noise":
            pool = healthy_vm_offsets()
            out.append(np.exp(rng.choice(pool, g.nodes)))
        else:
            sd = g.node_speed_spread if g.node_speed_spread >= 0 else default_spread
            out.append(np.exp(sd * rng.standard_normal(g.nodes)))
    return out


@dataclass
class Precomputed:
    """Everything random that is shared by all policies of one scenario run (same seed, same requests)."""

    requests: Requests
    speeds: list[np.ndarray]
    noise: np.ndarray  # per base request: service-time noise factor
    u: np.ndarray  # per base request: uniform draw (ECC stall)
    retry_noise: np.ndarray  # pool for retries and probes
    retry_u: np.ndarray

    @classmethod
    def build(cls, scn: Scenario, requests: Requests) -> Precomputed:
        rng = np.random.default_rng([scn.seed, 2])
        speeds = node_speeds(scn, rng)
        n = len(requests)
        cvs = np.asarray([g.jitter_cv for g in scn.groups])[requests.group] if n else np.zeros(0)
        sig = np.sqrt(np.log1p(cvs**2))
        noise = np.exp(sig * rng.standard_normal(n) - sig**2 / 2)
        m = max(1024, n // 2)
        cv0 = max(g.jitter_cv for g in scn.groups)
        s0 = math.sqrt(math.log1p(cv0**2))
        return cls(requests=requests, speeds=speeds, noise=noise, u=rng.random(n),
                   retry_noise=np.exp(s0 * rng.standard_normal(m) - s0**2 / 2), retry_u=rng.random(m))


@dataclass
class StateLog:
    """Per-node availability changes reported by a policy: ``(t, weight_fraction, quarantined)``."""

    changes: dict[tuple[int, int], list[tuple[float, float, bool]]] = field(default_factory=dict)
    series: dict[tuple[int, int], list[tuple[float, float, float]]] = field(default_factory=dict)
    # Every step-engine node's streamed progress per scrape period, in scenarios with a faulty node,
    # whatever the policy reads (the report's first evidence, :func:`sim.report.policy_report`): per group
    # ``(t, tokens, inter-token seconds, running, prompt tokens, kv usage)``, each a list over the
    # group's nodes in order (what a scrape of their /metrics shows).
    rows: dict[int, list[tuple[float, list[float], list[float], list[float], list[float], list[float]]]] = \
        field(default_factory=dict)


class GroupContext:
    """What a policy instance for one group may see and do (a gateway's view, nothing more)."""

    def __init__(self, sim: Simulation, gi: int) -> None:
        self.sim = sim
        self.group_index = gi
        self.group = sim.scn.groups[gi]
        self.n = self.group.nodes
        self.node_ids = [f"n{i}" for i in range(self.n)]
        self.outstanding = sim.outstanding[gi]  # gateway connections open per node (live list)
        self.members = sim.members[gi]  # live list of bools: node is in the pool
        self.rng = np.random.default_rng([sim.scn.seed, 3, gi])
        self.tracked = {node for (g, node) in sim.tracked if g == gi}
        self._last: dict[int, tuple[float, bool]] = {}

    def note(self, node: int, now: float, weight_fraction: float, quarantined: bool) -> None:
        """Report a node's routing weight (fraction of base) and whether it is out of service."""
        key = (round(weight_fraction, 3), quarantined)
        last = self._last.get(node)
        if last != key:
            self._last[node] = key
            self.sim.log.changes.setdefault((self.group_index, node), []).append(
                (now, weight_fraction, quarantined))

    def trace(self, node: int, now: float, z: float, weight_fraction: float) -> None:
        """Time series of a tracked (faulty) node's score and weight, for the plot."""
        self.sim.log.series.setdefault((self.group_index, node), []).append((now, z, weight_fraction))

    def send_probe(self, node: int, now: float, callback: Callable[[float, float, float, bool], None]) -> None:
        """Send one canary request of the scenario's probe size to ``node``.

        ``callback(now, ttft_ms, total_ms, ok)`` is called when the probe completes (or times out).
        """
        self.sim.send_probe(self.group_index, node, now, callback)


class Policy:
    """A gateway load-balancing policy for one group. Subclasses override what they need."""

    name = "base"
    wants_records = False
    wants_progress = False
    tick_s: float | None = None

    def __init__(self, ctx: GroupContext) -> None:
        self.ctx = ctx

    def pick(self, now: float) -> int:
        raise NotImplementedError

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        """One access-log line: called when an attempt completes or times out."""

    def on_tick(self, now: float) -> None:
        """Periodic evaluation (every ``tick_s``)."""

    def on_progress(self, now: float, interval_s: float, tokens: list[float], token_ms: list[float]) -> None:
        """Streamed decode progress of every node of the group over the last ``interval_s`` (called
        just before :meth:`on_tick` when the policy ``wants_progress`` and the gateway streams)."""

    reads_metrics = False

    def on_scrape(self, now: float, scrapes: list[tuple[int, Any]]) -> None:
        """Instead of :meth:`on_progress` when the nodes run the step engine and the policy
        ``reads_metrics``: each live node's parsed ``/metrics`` (``(local node, EngineCounters)``)."""

    def add_node(self, node: int, now: float) -> None:
        """A node joins the pool (scale-out / warm-up)."""


PolicyFactory = Callable[[GroupContext], Policy]


class Simulation:
    """One run of one policy over a scenario's precomputed requests."""

    def __init__(self, scn: Scenario, pre: Precomputed, factory: PolicyFactory,
                 progress: Callable[[float], None] | None = None) -> None:
        self.scn = scn
        self.pre = pre
        self.factory = factory
        self.progress = progress
        self.log = StateLog()
        gindex = {g.name: i for i, g in enumerate(scn.groups)}
        self.tracked = {(gindex[gname], node) for gname, node in scn.faulty}
        self.tracked.update((gindex[f.group], f.node) for f in scn.faults if f.node is not None)
        n_all = self._init_nodes(pre)
        self._init_faults(gindex)
        self._init_attempts()
        self.streaming = False  # set in run() when a policy wants streamed progress
        self.prog_s = [0.0] * n_all  # per node: inter-token time streamed since the last tick (s)
        self.prog_tok = [0.0] * n_all  # per node: tokens streamed since the last tick
        self.probe_cb: dict[int, Callable[[float, float, float, bool], None]] = {}
        self.probe_tokens: dict[int, tuple[int, int]] = {}  # probes of another size than the scenario's
        self.eng: list[NodeEngine | None] = [self._make_engine(n, pre) for n in range(n_all)]
        self.prog_prev = [(0, 0.0)] * n_all  # per engine node: (itl_count, itl_sum_s) at the last tick
        self.obs_prev = [(0, 0.0, 0)] * n_all  # the same and prompt tokens at the last observation
        self._init_requests(pre)
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.deadlines: deque[tuple[float, int]] = deque()
        self.timeout = scn.client.timeout_s
        self.policies: list[Policy] = []
        self.now = 0.0

    def _init_nodes(self, pre: Precomputed) -> int:
        """Flatten the groups' nodes (global id = ``offset[group] + local``) and give each its
        group's figures, its speed factor and an empty queue; every node in its pool. Returns the
        number of nodes."""
        scn = self.scn
        self.offset = []
        off = 0
        for g in scn.groups:
            self.offset.append(off)
            off += g.nodes
        n_all = off
        self.node_group = [gi for gi, g in enumerate(scn.groups) for _ in range(g.nodes)]
        self.node_local = [i for g in scn.groups for i in range(g.nodes)]
        self.speed = np.concatenate(pre.speeds).tolist()
        self.maxc = [scn.groups[gi].max_concurrency for gi in self.node_group]
        self.pre_ms = [scn.groups[gi].prefill_ms_per_token for gi in self.node_group]
        self.dec_ms = [scn.groups[gi].decode_ms_per_token for gi in self.node_group]
        self.curve = [decode_curve_table(g.decode_batch_curve, g.max_concurrency + 1) for g in scn.groups]
        self.running = [0] * n_all
        self.run_set: list[set[int]] = [set() for _ in range(n_all)]
        self.queue: list[deque[int]] = [deque() for _ in range(n_all)]
        self.served = [0] * n_all
        self.crashed = [False] * n_all
        self.members = [[True] * g.nodes for g in scn.groups]
        self.outstanding = [[0] * g.nodes for g in scn.groups]
        return n_all

    def _init_faults(self, gindex: dict[str, int]) -> None:
        """Each node's faults (a surge on every node of its group), and a node that warms up later
        than the start out of its pool until it joins."""
        scn = self.scn
        self.node_faults: list[list[Fault]] = [[] for _ in range(len(self.node_group))]
        for f in scn.faults:
            gi = gindex[f.group]
            targets = range(scn.groups[gi].nodes) if f.node is None else [f.node]
            for loc in targets:
                self.node_faults[self.offset[gi] + loc].append(f)
            if f.kind == "warmup" and f.start_s > 0:
                self.members[gi][f.node] = False

    def _init_attempts(self) -> None:
        """Empty attempt columns (Python lists: appends and scalar reads are what the hot loop does)."""
        self.a_req: list[int] = []
        self.a_kind: list[int] = []
        self.a_t: list[float] = []
        self.a_node: list[int] = []
        self.a_start: list[float] = []
        self.a_ttft: list[float] = []
        self.a_end: list[float] = []
        self.a_status: list[int] = []
        self.a_done: list[bool] = []
        self.a_ver: list[int] = []
        self.a_noise: list[float] = []
        self.a_u: list[float] = []
        self.a_service: list[float] = []  # service time without queueing, ms (for signal quality)
        self.a_gw: list[int] = []  # status in the gateway's log line (0 = client timeout)
        self.a_gw_t: list[float] = []  # time of the gateway's log line
        self.a_tok_ms: list[float] = []  # current ms per streamed output token (0: nothing streams)
        self.a_acc: list[float] = []  # the attempt's stream is accounted up to this time

    def _init_requests(self, pre: Precomputed) -> None:
        """The client requests' columns from the precomputed draws, none answered yet, and the noise
        pools retries and probes draw from."""
        req = pre.requests
        n_req = len(req)
        self.r_t = req.t.tolist()
        self.r_group = req.group.tolist()
        self.r_prompt = req.prompt.tolist()
        self.r_comp = req.completion.tolist()
        self.r_noise = pre.noise.tolist()
        self.r_u = pre.u.tolist()
        self.r_attempts = [0] * n_req
        self.r_final_t = [math.nan] * n_req
        self.r_final_status = [-1] * n_req
        self.r_ttft_t = [math.nan] * n_req
        self.retry_noise = pre.retry_noise.tolist()
        self.retry_u = pre.retry_u.tolist()
        self.n_extra = 0  # retries and probes so far (the next one's draw in those pools)

    # ------------------------------------------------------------------------------------------
    def _make_engine(self, n: int, pre: Precomputed) -> NodeEngine | None:
        """The vLLM V1 step engine of node ``n`` (``None``: the group uses the per-request model)."""
        g = self.scn.groups[self.node_group[n]]
        e = g.engine
        if e.kind != "vllm_v1":
            return None
        model = step_model(e.hardware, e.tp, e.max_num_batched_tokens + e.max_num_seqs)
        cap = e.kv_cache_tokens if e.kv_cache_tokens is not None else model.kv_capacity_tokens
        settings = NodeSettings(max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                                block_size=e.block_size, kv_capacity_tokens=cap, step_jitter_cv=e.step_jitter_cv)
        sig = math.sqrt(math.log1p(e.step_jitter_cv**2))
        rng = np.random.default_rng([self.scn.seed, 5, n])
        pool = np.exp(sig * rng.standard_normal(4096) - sig**2 / 2).tolist()
        pos = [0]

        def jitter() -> float:
            pos[0] = (pos[0] + 1) % len(pool)
            return pool[pos[0]]

        def admit(att: int, now: float) -> None:
            self.a_start[att] = now
            for f in self.node_faults[n]:
                if f.kind == "ecc_replay" and f.active(now) and self.a_u[att] < f.param("stall_prob", 0.0):
                    eng.pending_stall += f.param("stall_ms", 0.0) / 1000.0  # every stream of the node stops

        def preempted(att: int, kv_tokens: int) -> None:
            for f in self.node_faults[n]:
                if f.kind == "kv_swap" and f.active(self.now):
                    # the victim's cache goes out over the host link and will come back: both ways
                    res, _, _ = self.node_state(n, self.now)
                    eng.pending_stall += (2 * kv_tokens * model.host_ms_per_token * res.host
                                          * f.param("swap_factor", 0.0) / 1000.0)

        eng = NodeEngine(model, settings, self.speed[n], push=lambda t, ver: self.push(t, EV_NODE, n, ver),
                         on_first_token=self._first_token, on_finish=self._finish,
                         state=lambda now: self.node_state(n, now), jitter=jitter, on_admit=admit,
                         on_preempt=preempted)
        return eng

    def node_state(self, n: int, now: float) -> tuple[Resources, float, float]:
        """The faults of node ``n`` at ``now`` as resources (``scenarios/SCHEMA.md``, "Faults as
        resources"): ``(Resources, kv_capacity_fraction, step_multiplier)``."""
        faults = self.node_faults[n]
        if not faults:
            return HEALTHY, 1.0, 1.0
        sm = hbm = net = host = pf = 1.0
        frac = mult = 1.0
        eng = self.eng[n]
        for f in faults:
            if not f.active(now):
                continue
            k = f.kind
            if k == "thermal_throttle":  # output tokens/s at equal load / slowdown (profile.throttle_factor)
                c = throttle_factor(eng.model, f.param("slowdown", 1.0)) if eng is not None else 1.0
                sm *= c
                hbm *= c
                net *= c
            elif k == "sm_throttle":  # the SM clock alone: memory-bound decode slows much less
                sm *= f.param("slowdown", 1.0)
            elif k == "surge":
                mult *= f.param("slowdown", 1.0)
            elif k == "pcie_downgrade":
                d = f.param("decode_slowdown", 1.0)
                net *= d
                host *= d
                pf *= f.param("prefill_slowdown", 1.0)
            elif k == "drift":
                x = min(1.0, (now - f.start_s) / f.param("ramp_s", 1.0))
                v = 1.0 + (f.param("slowdown", 1.0) - 1.0) * x
                sm *= v
                hbm *= v
            elif k == "resource":
                sm *= f.param("sm_slowdown", 1.0)
                hbm *= f.param("hbm_slowdown", 1.0)
                net *= f.param("net_slowdown", 1.0)
                host *= f.param("host_slowdown", 1.0)
                pf *= f.param("prefill_slowdown", 1.0)
            elif k == "kv_loss":
                frac *= 1.0 - f.param("fraction", 0.0)
            elif k == "kv_swap" and eng is not None:
                tokens = f.param("swap_threshold", 0.5) * self.maxc[n] * KV_SWAP_TOKENS_PER_SLOT
                frac = min(frac, tokens / max(1.0, eng.cfg.kv_capacity_tokens))
            elif k == "warmup" and eng is not None and eng.served < f.param("requests", 0.0):
                mult *= f.param("slowdown", 1.0)
        if sm == hbm == net == host == pf == 1.0:
            return HEALTHY, frac, mult
        return Resources(sm=sm, hbm=hbm, net=net, host=host, prefill=pf), frac, mult

    def _first_token(self, att: int, t: float) -> None:
        self.a_ttft[att] = t

    def _finish(self, att: int, t: float) -> None:
        self.a_end[att] = t
        self.a_status[att] = STATUS_OK
        self.a_service[att] = (t - self.a_start[att]) * 1000.0
        if not self.a_done[att]:
            self.gateway_record(att, t, STATUS_OK)

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def factors(self, n: int, now: float) -> tuple[float, float]:
        """Fault multipliers ``(F_prefill, F_decode)`` of node ``n`` at ``now`` (step/drift/surge)."""
        fp = fd = 1.0
        for f in self.node_faults[n]:
            if not f.active(now):
                continue
            k = f.kind
            if k in ("thermal_throttle", "surge"):
                s = f.param("slowdown", 1.0)
                fp *= s
                fd *= s
            elif k == "pcie_downgrade":
                fp *= f.param("prefill_slowdown", 1.0)
                fd *= f.param("decode_slowdown", 1.0)
            elif k == "drift":
                frac = min(1.0, (now - f.start_s) / f.param("ramp_s", 1.0))
                s = 1.0 + (f.param("slowdown", 1.0) - 1.0) * frac
                fp *= s
                fd *= s
        return fp, fd

    def start(self, att: int, n: int, now: float) -> None:
        """Admit attempt ``att`` into a slot of node ``n`` and schedule its completion."""
        self.running[n] += 1
        self.run_set[n].add(att)
        b = self.running[n]
        p = self.a_prompt_of(att)
        c = self.a_comp_of(att)
        noise = self.a_noise[att] * self.speed[n]
        pre = self.pre_ms[n] * p * noise
        dec = self.dec_ms[n] * self.curve[self.node_group[n]][b] * c * noise
        stall = 0.0
        if self.node_faults[n]:
            fp, fd = self.factors(n, now)
            extra = 1.0
            for f in self.node_faults[n]:
                if not f.active(now):
                    continue
                if f.kind == "ecc_replay" and self.a_u[att] < f.param("stall_prob", 0.0):
                    stall += f.param("stall_ms", 0.0)
                elif f.kind == "kv_swap":
                    load = b / self.maxc[n]
                    extra *= 1.0 + f.param("swap_factor", 0.0) * max(0.0, load - f.param("swap_threshold", 0.5))
                elif f.kind == "warmup" and self.served[n] < f.param("requests", 0.0):
                    extra *= f.param("slowdown", 1.0)
            pre *= fp * extra
            dec *= fd * extra
        self.served[n] += 1
        ttft = now + (pre + dec / c) / 1000.0
        end = now + (pre + dec + stall) / 1000.0
        self.a_start[att] = now
        self.a_ttft[att] = ttft
        self.a_end[att] = end
        self.a_service[att] = pre + dec + stall
        self.a_status[att] = STATUS_OK
        if c >= 2:
            self.a_tok_ms[att] = (end - ttft) * 1000.0 / (c - 1)
            self.a_acc[att] = ttft
        self.push(end, EV_COMPLETE, att, self.a_ver[att])

    # prompt/completion of an attempt: client attempts read the request, probes the probe size.
    def a_prompt_of(self, att: int) -> int:
        r = self.a_req[att]
        if r < 0:
            return self.probe_tokens[att][0] if att in self.probe_tokens else self.scn.probe_prompt_tokens
        return self.r_prompt[r]

    def a_comp_of(self, att: int) -> int:
        r = self.a_req[att]
        if r < 0:
            return self.probe_tokens[att][1] if att in self.probe_tokens else self.scn.probe_completion_tokens
        return self.r_comp[r]

    def new_attempt(self, req: int, kind: int, now: float, noise: float, u: float) -> int:
        att = len(self.a_req)
        self.a_req.append(req)
        self.a_kind.append(kind)
        self.a_t.append(now)
        self.a_node.append(-1)
        self.a_start.append(math.nan)
        self.a_ttft.append(math.nan)
        self.a_end.append(math.nan)
        self.a_status.append(-1)
        self.a_done.append(False)
        self.a_ver.append(0)
        self.a_noise.append(noise)
        self.a_u.append(u)
        self.a_service.append(math.nan)
        self.a_gw.append(-1)
        self.a_gw_t.append(math.nan)
        self.a_tok_ms.append(0.0)
        self.a_acc.append(math.inf)
        return att

    def stream_to(self, att: int, upto: float) -> None:
        """Account attempt ``att``'s streamed tokens up to ``upto`` to its node's progress."""
        tm = self.a_tok_ms[att]
        dt = upto - self.a_acc[att]
        if tm > 0.0 and dt > 0.0:
            n = self.a_node[att]
            self.prog_s[n] += dt
            self.prog_tok[n] += dt * 1000.0 / tm
            self.a_acc[att] = upto

    def place(self, att: int, n: int, now: float) -> None:
        """Send an attempt to node ``n``: fast error, a free slot, or the queue."""
        self.a_node[att] = n
        if self.crashed[n]:
            f = next(f for f in self.node_faults[n] if f.kind == "crash")
            self.a_start[att] = now
            self.a_status[att] = int(f.param("error_status", 503))
            end = now + f.param("error_after_ms", 5.0) / 1000.0
            self.a_end[att] = end
            self.push(end, EV_COMPLETE, att, self.a_ver[att])
        elif self.eng[n] is not None:
            self.eng[n].submit(att, self.a_prompt_of(att), self.a_comp_of(att), now)
        elif self.running[n] < self.maxc[n]:
            self.start(att, n, now)
        else:
            self.queue[n].append(att)

    def dispatch(self, req: int, now: float, noise: float, u: float) -> None:
        gi = self.r_group[req]
        att = self.new_attempt(req, KIND_CLIENT, now, noise, u)
        self.r_attempts[req] += 1
        local = self.policies[gi].pick(now)
        self.outstanding[gi][local] += 1
        self.place(att, self.offset[gi] + local, now)
        self.deadlines.append((now + self.timeout, att))

    def send_probe(self, gi: int, local: int, now: float, cb: Callable[[float, float, float, bool], None],
                   tokens: tuple[int, int] | None = None) -> None:
        """One canary request to a node (``tokens``: its ``(prompt, completion)``; default the
        scenario's probe size); ``cb(now, ttft_ms, total_ms, ok)`` when it completes or times out."""
        k = self.n_extra % len(self.retry_noise)
        self.n_extra += 1
        att = self.new_attempt(-1, KIND_PROBE, now, self.retry_noise[k], self.retry_u[k])
        self.probe_cb[att] = cb
        if tokens is not None:
            self.probe_tokens[att] = tokens
        self.place(att, self.offset[gi] + local, now)
        self.deadlines.append((now + self.timeout, att))

    def gateway_record(self, att: int, now: float, status: int) -> None:
        """The attempt's access-log line: notify the policy and settle the client request."""
        if self.streaming and not self.a_done[att]:
            self.stream_to(att, now)  # what streamed before the end (or before the client gave up)
        self.a_done[att] = True
        self.a_gw[att] = status
        self.a_gw_t[att] = now
        n = self.a_node[att]
        if status == STATUS_TIMEOUT and self.eng[n] is not None:
            self.eng[n].abort(att, now)  # the client went away: the server aborts the request
        gi = self.node_group[n]
        local = self.node_local[n]
        req = self.a_req[att]
        if status == STATUS_TIMEOUT:
            total_ms = self.timeout * 1000.0
            ttft_ms = math.nan
        else:
            total_ms = (now - self.a_t[att]) * 1000.0
            ttft_ms = (self.a_ttft[att] - self.a_t[att]) * 1000.0 if status == STATUS_OK else math.nan
        if req < 0:
            cb = self.probe_cb.pop(att)
            cb(now, ttft_ms, total_ms, status == STATUS_OK)
            return
        self.outstanding[gi][local] -= 1
        pol = self.policies[gi]
        if pol.wants_records:
            pol.on_record(local, now, self.r_prompt[req], self.r_comp[req], ttft_ms, total_ms, status)
        if status == STATUS_OK:
            self.r_final_t[req] = now
            self.r_final_status[req] = STATUS_OK
            self.r_ttft_t[req] = self.a_ttft[att]
        elif self.r_attempts[req] <= self.scn.client.retries:
            self.push(now + self.scn.client.retry_backoff_s, EV_RETRY, req)
        else:
            self.r_final_t[req] = now
            self.r_final_status[req] = status

    def complete(self, att: int, ver: int, now: float) -> None:
        if ver != self.a_ver[att]:
            return  # rescheduled by a fault edge
        n = self.a_node[att]
        if att in self.run_set[n]:
            self.run_set[n].discard(att)
            self.running[n] -= 1
            q = self.queue[n]
            while q and self.running[n] < self.maxc[n]:
                nxt = q.popleft()
                self.start(nxt, n, now)
        if not self.a_done[att]:
            self.gateway_record(att, now, self.a_status[att])

    def edge(self, fi: int, now: float) -> None:
        """A fault starts/ends (or a drift step): stretch running work, crash/uncrash nodes."""
        f = self.scn.faults[fi]
        gi = next(i for i, g in enumerate(self.scn.groups) if g.name == f.group)
        targets = range(self.scn.groups[gi].nodes) if f.node is None else [f.node]
        eps = 1e-9
        for loc in targets:
            n = self.offset[gi] + loc
            if f.kind == "crash":
                self.crashed[n] = f.active(now + eps)
                if self.crashed[n]:
                    doomed = list(self.run_set[n]) + list(self.queue[n])
                    if self.eng[n] is not None:
                        doomed += self.eng[n].clear()
                    self.run_set[n].clear()
                    self.queue[n].clear()
                    self.running[n] = 0
                    for att in doomed:
                        if self.streaming and not self.a_done[att]:
                            self.stream_to(att, now)
                        self.a_tok_ms[att] = 0.0
                        self.a_ver[att] += 1
                        self.a_status[att] = int(f.param("error_status", 503))
                        self.push(now + f.param("error_after_ms", 5.0) / 1000.0, EV_COMPLETE, att, self.a_ver[att])
                continue
            if self.eng[n] is not None:
                self.eng[n].interrupt(now)  # the next step is planned under the new resources
                continue
            if f.kind not in ("thermal_throttle", "pcie_downgrade", "surge", "drift"):
                continue
            op, od = self.factors(n, now - eps)
            np_, nd = self.factors(n, now + eps)
            if op == np_ and od == nd:
                continue
            rp, rd = np_ / op, nd / od
            for att in self.run_set[n]:
                if self.streaming and not self.a_done[att]:
                    self.stream_to(att, now)  # at the old rate up to the edge
                ttft, end = self.a_ttft[att], self.a_end[att]
                if now < ttft:
                    new_ttft = now + (ttft - now) * rp
                    end = new_ttft + (end - ttft) * rd
                    ttft = new_ttft
                else:
                    end = now + (end - now) * rd
                self.a_service[att] += (end - self.a_end[att]) * 1000.0  # service time includes the stretch
                self.a_ttft[att] = ttft
                self.a_end[att] = end
                self.a_tok_ms[att] *= rd
                if self.a_acc[att] > now:  # not streaming yet: it starts at the (moved) first token
                    self.a_acc[att] = ttft
                self.a_ver[att] += 1
                self.push(end, EV_COMPLETE, att, self.a_ver[att])

    def stall_event(self, fi: int, now: float) -> None:
        """A ``periodic_stall``: every stream of the node stops for ``stall_ms`` at once."""
        f = self.scn.faults[fi]
        if not f.active(now):  # ended early (:meth:`end_fault`) after its stalls were scheduled
            return
        gi = next(i for i, g in enumerate(self.scn.groups) if g.name == f.group)
        n = self.offset[gi] + (f.node or 0)
        if self.eng[n] is not None and not self.crashed[n]:
            self.eng[n].stall(f.param("stall_ms", 0.0) / 1000.0, now)

    def deliver_progress(self, gi: int, now: float, pol: Policy) -> None:
        """Hand group ``gi``'s streamed progress since the last tick to its policy, then reset it."""
        lo = self.offset[gi]
        hi = lo + self.scn.groups[gi].nodes
        a_done, a_tok_ms, a_acc = self.a_done, self.a_tok_ms, self.a_acc
        engines, prog_prev, prog_tok, prog_s = self.eng, self.prog_prev, self.prog_tok, self.prog_s
        for n in range(lo, hi):  # stream_to inlined: this loop visits every running request each tick
            eng = engines[n]
            if eng is not None:  # the step engine's inter-token counters (what its /metrics shows)
                eng.progress_to(now)
                itl = eng.m.itl
                c0, s0 = prog_prev[n]
                prog_tok[n] += itl.total - c0
                prog_s[n] += itl.sum - s0
                prog_prev[n] = (itl.total, itl.sum)
                continue
            secs = tokens = 0.0
            for att in self.run_set[n]:
                tm = a_tok_ms[att]
                dt = now - a_acc[att]
                if tm > 0.0 and dt > 0.0 and not a_done[att]:
                    secs += dt
                    tokens += dt * 1000.0 / tm
                    a_acc[att] = now
            self.prog_s[n] += secs
            self.prog_tok[n] += tokens
        tokens = self.prog_tok[lo:hi]
        token_ms = [x * 1000.0 for x in self.prog_s[lo:hi]]
        self.prog_tok[lo:hi] = [0.0] * (hi - lo)
        self.prog_s[lo:hi] = [0.0] * (hi - lo)
        if self.eng[lo] is not None and getattr(pol, "reads_metrics", False):
            pol.on_scrape(now, self.scrape(gi, now))
        else:
            pol.on_progress(now, pol.tick_s or 0.0, tokens, token_ms)

    def observe(self, now: float) -> None:
        """Log every step-engine node's inter-token counters since the last observation
        (:attr:`StateLog.rows`). Accounting the finished steps changes no timing."""
        for gi, g in enumerate(self.scn.groups):
            lo = self.offset[gi]
            row = [[0.0] * g.nodes for _ in range(5)]
            for local in range(g.nodes):
                eng = self.eng[lo + local]
                if eng is None:
                    continue
                eng.progress_to(now)
                m = eng.m
                c0, s0, p0 = self.obs_prev[lo + local]
                row[0][local], row[1][local] = m.itl.total - c0, m.itl.sum - s0
                row[2][local], row[3][local], row[4][local] = m.running, m.prompt_tokens - p0, m.kv_usage
                self.obs_prev[lo + local] = (m.itl.total, m.itl.sum, m.prompt_tokens)
            self.log.rows.setdefault(gi, []).append((now, *row))

    def scrape(self, gi: int, now: float) -> list[tuple[int, Any]]:
        """``GET /metrics`` of every live node of group ``gi`` on the step engine: the page is rendered
        and parsed back by the control plane's parser (:func:`detector.engine_metrics.parse`), so a
        policy gets exactly the counters production would. ``[(local node, EngineCounters)]``.
        The page holds the samples that parser reads (:func:`sim.vllm.scrape_page`: the full
        page parses to the same counters; its bucket lines would only cost time)."""
        from detector.engine_metrics import parse

        lo = self.offset[gi]
        out = []
        engines, crashed = self.eng, self.crashed
        for local in range(self.scn.groups[gi].nodes):
            eng = engines[lo + local]
            if eng is None or crashed[lo + local]:
                continue  # a crashed node's scrape fails
            eng.progress_to(now)
            counters = parse(scrape_page(eng.m))
            if counters is not None:
                out.append((local, counters))
        return out

    # ------------------------------------------------------------------------------------------
    def run(self) -> Simulation:
        """Simulate the whole scenario (:meth:`begin`, then :meth:`advance` to the end)."""
        self.begin()
        self.advance(math.inf)
        return self

    def begin(self) -> Simulation:
        """Create the policies and schedule ticks and fault events; :meth:`advance` then runs the loop
        (in steps, as the demo does in real time, or at once)."""
        scn = self.scn
        for gi in range(len(scn.groups)):
            self.policies.append(self.factory(GroupContext(self, gi)))
        # The first tick at a random phase of the period (per seed): a fault onset at a round second
        # must not always fall right before an evaluation.
        phase = float(np.random.default_rng([scn.seed, 7]).random())
        for gi, pol in enumerate(self.policies):
            if pol.tick_s:
                self.push(pol.tick_s * (0.5 + phase), EV_TICK, gi)
        self.streaming = scn.streams and any(p.wants_progress and p.tick_s for p in self.policies)
        self.observe_s = scn.scrape_s or scn.tick_s
        if scn.faulty and any(e is not None for e in self.eng):
            self.push(self.observe_s * (0.5 + phase), EV_OBSERVE)
        for fi, f in enumerate(scn.faults):
            if f.kind == "warmup":
                if f.start_s > 0:
                    self.push(f.start_s, EV_JOIN, fi)
                continue
            self.push(f.start_s, EV_EDGE, fi)
            if f.end_s is not None:
                self.push(f.end_s, EV_EDGE, fi)
            if f.kind == "periodic_stall":
                t = f.start_s
                stop = min(f.end_s or math.inf, scn.duration_s)
                while t < stop:
                    self.push(t, EV_STALL, fi)
                    t += f.param("period_s", 1.0)
            if f.kind == "drift":
                t = f.start_s + DRIFT_STEP_S
                stop = min(f.start_s + f.param("ramp_s", 1.0), f.end_s or math.inf, scn.duration_s)
                while t < stop:
                    self.push(t, EV_EDGE, fi)
                    t += DRIFT_STEP_S
        # Events after this are not simulated (attempts still running at the end stay unfinished).
        self.end_all = scn.duration_s + (scn.client.retries + 1) * (self.timeout + scn.client.retry_backoff_s) + 1.0
        self.next_arrival = 0
        self.next_progress = 0.0
        return self

    def end_fault(self, fi: int, t: float) -> bool:
        """End fault ``fi`` of the scenario at ``t`` instead of at its ``end_s``: a heal decided while
        the simulation runs (the demo's ``DEMO_HEAL_AFTER_PROBES``). ``t`` is not before the time
        already simulated (:meth:`advance` has not passed it). Returns whether it changed the end (a
        fault already over by ``t`` keeps its own). The scheduled end stays in the queue and finds
        nothing to change, as an edge without a change in speed does."""
        old = self.scn.faults[fi]
        if t < self.now:
            raise ValueError(f"cannot end a fault at {t:g} s: the simulation is at {self.now:g} s")
        if old.end_s is not None and old.end_s <= t:
            return False
        new = replace(old, end_s=t)
        self.scn = replace(self.scn, faults=(*self.scn.faults[:fi], new, *self.scn.faults[fi + 1:]))
        self.node_faults = [[new if f is old else f for f in faults] for faults in self.node_faults]
        self.push(t, EV_EDGE, fi)
        return True

    def advance(self, until: float) -> Simulation:
        """Process every arrival, timeout and event up to time ``until`` (and not past ``end_all``).
        Requests appended to the ``r_*`` columns between two calls are served (the demo's endless
        workload)."""
        scn = self.scn
        end_all = self.end_all
        r_t = self.r_t
        n_req = len(r_t)
        i = self.next_arrival
        heap = self.heap
        deadlines = self.deadlines
        a_done = self.a_done
        next_progress = self.next_progress
        inf = math.inf
        while True:
            t_arr = r_t[i] if i < n_req else inf
            t_ev = heap[0][0] if heap else inf
            now = t_arr if t_arr <= t_ev else t_ev
            # Timeouts due before the next event happen first (exact: nothing else happens in between;
            # a retry it schedules is then the next event).
            if deadlines and deadlines[0][0] <= now:
                if deadlines[0][0] > until:
                    break
                dl, att = deadlines.popleft()
                if not a_done[att]:
                    self.gateway_record(att, dl, STATUS_TIMEOUT)
                continue
            if now > end_all or now == inf or now > until:
                break
            self.now = now
            if t_ev <= t_arr:
                t, _, kind, a, b = heapq.heappop(heap)
                if kind == EV_COMPLETE:
                    self.complete(a, b, t)
                elif kind == EV_RETRY:
                    k = self.n_extra % len(self.retry_noise)
                    self.n_extra += 1
                    self.dispatch(a, t, self.retry_noise[k], self.retry_u[k])
                elif kind == EV_NODE:
                    self.now = t
                    self.eng[a].phase_end(t, b)
                elif kind == EV_OBSERVE:
                    self.observe(t)
                    if t + self.observe_s <= end_all:
                        self.push(t + self.observe_s, EV_OBSERVE)
                elif kind == EV_STALL:
                    self.stall_event(a, t)
                elif kind == EV_TICK:
                    pol = self.policies[a]
                    if self.streaming and pol.wants_progress:
                        self.deliver_progress(a, t, pol)
                    pol.on_tick(t)
                    if t + pol.tick_s <= end_all:
                        self.push(t + pol.tick_s, EV_TICK, a)
                elif kind == EV_EDGE:
                    self.edge(a, t)
                elif kind == EV_JOIN:
                    f = scn.faults[a]
                    gi = next(j for j, g in enumerate(scn.groups) if g.name == f.group)
                    self.members[gi][f.node] = True
                    self.served[self.offset[gi] + f.node] = 0
                    self.policies[gi].add_node(f.node, t)
            else:
                self.dispatch(i, t_arr, self.r_noise[i], self.r_u[i])
                i += 1
                if self.progress is not None and t_arr >= next_progress:
                    self.progress(t_arr)
                    next_progress = t_arr + 10.0
        self.next_arrival = i
        self.next_progress = next_progress
        return self

    # ------------------------------------------------------------------------------------------
    def attempts(self) -> dict[str, np.ndarray]:
        """Attempt columns as numpy arrays (after :meth:`run`)."""
        return {
            "req": np.asarray(self.a_req, dtype=np.int64),
            "kind": np.asarray(self.a_kind, dtype=np.int8),
            "t": np.asarray(self.a_t),
            "node": np.asarray(self.a_node, dtype=np.int64),
            "start": np.asarray(self.a_start),
            "ttft": np.asarray(self.a_ttft),
            "end": np.asarray(self.a_end),
            "status": np.asarray(self.a_status, dtype=np.int64),
            "done": np.asarray(self.a_done, dtype=bool),
            "service_ms": np.asarray(self.a_service),
            "gw_status": np.asarray(self.a_gw, dtype=np.int64),
            "gw_t": np.asarray(self.a_gw_t),
        }

    def summary_arrays(self) -> dict[str, Any]:
        return {
            "final_t": np.asarray(self.r_final_t),
            "final_status": np.asarray(self.r_final_status, dtype=np.int64),
            "ttft_t": np.asarray(self.r_ttft_t),
            "attempts": np.asarray(self.r_attempts, dtype=np.int64),
        }
