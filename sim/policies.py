"""Gateway policies compared by the benchmark (one instance per model group).

Baselines without outlier detection: ``round_robin``, ``least_conn`` (fewest open connections, random
tie-break), ``p2c_ewma`` (Finagle/Linkerd peak-EWMA power of two choices).

``envoy_errors``: Envoy outlier detection with its defaults, errors only: ``consecutive_5xx = 5``
(timeouts count, as locally-originated 5xx do by default), ejection for ``30 s * times ejected``,
at most ``max_ejection_percent = 10`` % of hosts ejected, un-ejection checked every ``interval = 10 s``;
round robin over the remaining hosts.

``seed_zscore``: seed 000's Go controller and the rules its text adds: per node EMA (alpha 0.15,
first sample initialises) of ``T_norm = T_total / (N_prompt * 0.25 + N_completion)`` over every
access-log line (it has no notion of status: a fast error is a fast sample), every 200 ms a baseline
over non-quarantined nodes with more than 5 samples (needs >= 3), population sd,
``Z = (EMA - mean) / (sd + 1e-6)``; ``Z >= 3.5`` on 3 consecutive evaluations -> quarantined (weight
0); ``2 <= Z < 3.5`` -> ``int(100 * 2^-(Z-2))``, min 1; below 2 a degraded node is restored to 100.
From the seed's text (its code leaves them out): the **safeguard** ("when the isolated nodes exceed
30 %, pause isolation": a quarantine that would take the group's quarantined share over
:data:`SEED_SAFEGUARD_FRACTION` is not made, the node keeps its weight) and **canary recovery**
("every 10 s a quarantined node gets one synthetic request; 3 consecutive probes back within
``mu + 1.0 sigma`` of the cluster and it returns, its weight restored step by step": a probe's
``T_norm`` against the last evaluation's EMA mean and sd; after the 3rd pass the node re-enters as
degraded at weight 25 with its EMA restarted from the probes' mean, and the Z rule above restores
it). The seed's ``Route()`` always returns the max-weight node (a bug: it would send all traffic to
one node), so we route with smooth weighted round robin over the seed's weights, and with all weights
0 to ``nodes[0]`` as its fallback does.

``seed_p99p50``: seed 001's Rust health checker: per node a window of the last 1,000 raw latencies;
every 30 s, a node with < 100 samples is InsufficientData; ``P99/P50 > 3.0`` (nearest-rank
percentile ``sorted[round(p/100*(len-1))]``) or, per its heterogeneity section, ``P50 > 2 * median of
the nodes' P50`` marks it Suspect; anomalous in 3 consecutive windows ("3 windows x 30 s = 90 s") ->
Unhealthy, removed from the LB (the seed's code compares the time since the first Suspect window with
90 s, which first holds at the 4th window; its text says 3 windows, and so does the project's own tail
rule); a normal window returns it to Healthy. Removed nodes are no longer analysed, so its
``probe_quarantined`` never re-adds them (as written). Round robin over the active nodes. It reads raw
latency, as written: a healthy node's raw P99/P50 is about 8 on LLM traffic (prompt and output lengths
span orders of magnitude), so it flags healthy nodes.

``seed_p99p50_norm``: the same rule, fairly fed: each window value is what ``default``'s tail rule
reads (:mod:`detector.detectors.tail`): the request's queue-free decode time per output token,
``(total - TTFT) / (completion - 1)`` (:func:`detector.samples.decode_per_token`), over the group's
median of it; for a line without one (one output token, no TTFT, an error or a timeout) the seed's
``T_norm`` over the group's median ``T_norm``. Both medians are taken over every analysed node's
window at the 30 s analysis.

:data:`POLICY_INPUTS` names what each policy reads (the report prints it).
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np

from detector.picking import SmoothWeightedRoundRobin
from detector.states import safeguard_cap
from sim import seed
from sim.engine import STATUS_OK, STATUS_TIMEOUT, GroupContext, Policy


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        self.i = -1
        self.n = ctx.n

    def pick(self, now: float) -> int:
        members = self.ctx.members
        for _ in range(self.n):
            self.i = (self.i + 1) % self.n
            if members[self.i]:
                return self.i
        return 0


class LeastConn(Policy):
    name = "least_conn"

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        self.rand = random.Random(int(ctx.rng.integers(1 << 31)))
        self.avail = [i for i in range(ctx.n) if ctx.members[i]]

    def add_node(self, node: int, now: float) -> None:
        self.avail = [i for i in range(self.ctx.n) if self.ctx.members[i]]

    def pick(self, now: float) -> int:
        out = self.ctx.outstanding
        avail = self.avail
        m = min(out[i] for i in avail)
        cand = [i for i in avail if out[i] == m]
        return cand[0] if len(cand) == 1 else cand[int(self.rand.random() * len(cand))]


class P2CEwma(Policy):
    """Peak-EWMA power of two choices (Finagle ``PeakEwma``, Linkerd): decay time ``tau = 10 s``.

    cost = decayed peak-EWMA latency * (open connections + 1); a node with open connections and no
    latency yet costs a large penalty; among two random distinct nodes the cheaper is picked.
    """

    name = "p2c_ewma"
    wants_records = True
    TAU_S = 10.0
    PENALTY = 1e9

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        self.rand = random.Random(int(ctx.rng.integers(1 << 31)))
        self.cost = [0.0] * ctx.n
        self.stamp = [0.0] * ctx.n
        self.avail = [i for i in range(ctx.n) if ctx.members[i]]

    def add_node(self, node: int, now: float) -> None:
        self.avail = [i for i in range(self.ctx.n) if self.ctx.members[i]]

    def _load(self, i: int, now: float) -> float:
        pending = self.ctx.outstanding[i]
        c = self.cost[i] * math.exp(-max(0.0, now - self.stamp[i]) / self.TAU_S)
        if c == 0.0 and pending:
            return self.PENALTY + pending
        return c * (pending + 1)

    def pick(self, now: float) -> int:
        avail = self.avail
        if len(avail) == 1:
            return avail[0]
        a, b = self.rand.sample(avail, 2)
        return a if self._load(a, now) <= self._load(b, now) else b

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        w = math.exp(-max(0.0, now - self.stamp[node]) / self.TAU_S)
        c = self.cost[node]
        self.cost[node] = total_ms if total_ms > c else c * w + total_ms * (1.0 - w)
        self.stamp[node] = now


class EnvoyErrors(Policy):
    name = "envoy_errors"
    wants_records = True
    tick_s = 10.0  # Envoy's outlier-detection interval (un-ejection is checked on it)
    CONSECUTIVE_5XX = 5
    BASE_EJECTION_S = 30.0
    MAX_EJECTION_PERCENT = 10.0

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        self.consecutive = [0] * ctx.n
        self.times_ejected = [0] * ctx.n
        self.ejected_until = [0.0] * ctx.n
        self.ejected = [False] * ctx.n
        self.i = -1

    def pick(self, now: float) -> int:
        members, ejected, n = self.ctx.members, self.ejected, self.ctx.n
        for _ in range(n):
            self.i = (self.i + 1) % n
            if members[self.i] and not ejected[self.i]:
                return self.i
        return max(self.i, 0)

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        if status == STATUS_TIMEOUT or status >= 500:
            self.consecutive[node] += 1
            if self.consecutive[node] >= self.CONSECUTIVE_5XX and not self.ejected[node]:
                n_members = sum(self.ctx.members)
                if 100.0 * sum(self.ejected) / n_members < self.MAX_EJECTION_PERCENT:
                    self.times_ejected[node] += 1
                    self.ejected[node] = True
                    self.ejected_until[node] = now + self.BASE_EJECTION_S * self.times_ejected[node]
                    self.ctx.note(node, now, 0.0, True)
                self.consecutive[node] = 0
        else:
            self.consecutive[node] = 0

    def on_tick(self, now: float) -> None:
        for i in range(self.ctx.n):
            if self.ejected[i] and now >= self.ejected_until[i]:
                self.ejected[i] = False
                self.ctx.note(i, now, 1.0, False)


#: Seed 000's safeguard: isolation pauses when the isolated share of the group would exceed this.
SEED_SAFEGUARD_FRACTION = 0.30


class SeedZScore(Policy):
    """Seed 000 (:mod:`sim.seed`: its rules and its Z) as a gateway policy, with the seed text's
    safeguard and canary recovery (module docstring)."""

    name = "seed_zscore"
    wants_records = True
    tick_s = 0.2
    ALPHA = seed.ALPHA
    BASE = seed.BASE
    CANARY_PERIOD_S = 10.0  # seed 000: "every fixed period (e.g. 10 s) one synthetic request"
    CANARY_PASSES = 3  # "3 consecutive probes within mu + 1.0 sigma"
    CANARY_SIGMAS = 1.0
    RESTORE_WEIGHT = 25  # "restored step by step": re-enters degraded, the Z rule lifts it to 100

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        n = ctx.n
        self.ema = [0.0] * n
        self.samples = [0] * n
        self.state = [0] * n  # 0 healthy, 1 degraded, 2 quarantined
        self.weight = [self.BASE if ctx.members[i] else 0 for i in range(n)]
        self.slow = [0] * n
        self.swrr = SmoothWeightedRoundRobin(np.asarray(self.weight, dtype=np.float64))
        self.mean = self.std = math.nan  # the last evaluation's cluster baseline (the canary's reference)
        self.next_probe = [math.inf] * n
        self.probing = [False] * n
        self.passes: list[list[float]] = [[] for _ in range(n)]

    def add_node(self, node: int, now: float) -> None:
        self.weight[node] = self.BASE
        self.swrr.set_weights(np.asarray(self.weight, dtype=np.float64))

    def pick(self, now: float) -> int:
        if self.swrr.total <= 0:
            return 0  # the seed's fallback: d.nodes[0]
        return self.swrr.pick()

    def t_norm(self, prompt: int, completion: int, total_ms: float) -> float:
        return seed.t_norm(prompt, completion, total_ms)

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        x = self.t_norm(prompt, completion, total_ms)
        if self.samples[node] == 0:
            self.ema[node] = x
        else:
            self.ema[node] = self.ALPHA * x + (1 - self.ALPHA) * self.ema[node]
        self.samples[node] += 1

    def _quarantine_allowed(self) -> bool:
        out = sum(1 for i in range(self.ctx.n) if self.state[i] == 2)
        return out + 1 <= safeguard_cap(SEED_SAFEGUARD_FRACTION, sum(self.ctx.members))

    def on_tick(self, now: float) -> None:
        ctx = self.ctx
        members = ctx.members
        self._probe_due(now)
        out = ~np.asarray(members, dtype=bool) | (np.asarray(self.state) == 2)
        pb = seed.zscores(np.asarray(self.ema), np.asarray(self.samples), out)
        if pb.peers < seed.MIN_NODES:
            return
        self.mean, self.std = pb.baseline, pb.spread
        changed = False
        for i in range(ctx.n):
            if not members[i] or self.samples[i] <= 5:
                continue
            z = float(pb.z[i])
            if self.state[i] == 2:  # the canary decides (seed 000: not recomputed here)
                if i in ctx.tracked:
                    ctx.trace(i, now, z, 0.0)
                continue
            old_w = self.weight[i]
            if z >= seed.QUARANTINE_Z:
                self.slow[i] += 1
                if self.slow[i] >= seed.SLOW_EVALUATIONS and self._quarantine_allowed():
                    self.state[i] = 2
                    self.weight[i] = 0
                    self.slow[i] = 0
                    self.passes[i] = []
                    self.next_probe[i] = now + self.CANARY_PERIOD_S
            elif z >= seed.DEGRADE_Z:
                self.state[i] = 1
                self.weight[i] = seed.weight(z)
            else:
                self.slow[i] = 0
                if self.state[i] == 1:
                    self.state[i] = 0
                    self.weight[i] = self.BASE
            if self.weight[i] != old_w:
                changed = True
                ctx.note(i, now, self.weight[i] / self.BASE, self.state[i] == 2)
            if i in ctx.tracked:
                ctx.trace(i, now, z, self.weight[i] / self.BASE)
        if changed:
            self.swrr.set_weights(np.asarray(self.weight, dtype=np.float64))

    def _probe_due(self, now: float) -> None:
        for i in range(self.ctx.n):
            if self.state[i] == 2 and not self.probing[i] and now >= self.next_probe[i]:
                self.probing[i] = True
                self.next_probe[i] = now + self.CANARY_PERIOD_S
                self.ctx.send_probe(i, now, self._probe_callback(i))

    def _probe_callback(self, i: int):
        scn = self.ctx.sim.scn

        def done(now: float, ttft_ms: float, total_ms: float, ok: bool) -> None:
            self.probing[i] = False
            if self.state[i] != 2:
                return
            x = self.t_norm(scn.probe_prompt_tokens, scn.probe_completion_tokens, total_ms)
            if ok and math.isfinite(self.mean) and x <= self.mean + self.CANARY_SIGMAS * self.std:
                self.passes[i].append(x)
            else:
                self.passes[i] = []
            if len(self.passes[i]) >= self.CANARY_PASSES:
                self.state[i] = 1
                self.weight[i] = self.RESTORE_WEIGHT
                self.ema[i] = sum(self.passes[i]) / len(self.passes[i])
                self.passes[i] = []
                self.next_probe[i] = math.inf
                self.ctx.note(i, now, self.weight[i] / self.BASE, False)
                self.swrr.set_weights(np.asarray(self.weight, dtype=np.float64))

        return done


class SeedP99P50(Policy):
    name = "seed_p99p50"
    wants_records = True
    tick_s = 30.0
    WINDOW = 1000
    MIN_SAMPLES = 100
    RATIO = 3.0
    SUSPECT_WINDOWS = 3
    CROSS_P50 = 2.0

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        n = ctx.n
        self.window: list[deque] = [deque(maxlen=self.WINDOW) for _ in range(n)]
        self.status = ["unknown"] * n
        self.anomalous_windows = [0] * n
        self.removed = [False] * n
        self.i = -1

    def pick(self, now: float) -> int:
        members, removed, n = self.ctx.members, self.removed, self.ctx.n
        for _ in range(n):
            self.i = (self.i + 1) % n
            if members[self.i] and not removed[self.i]:
                return self.i
        self.i = (self.i + 1) % n  # everything removed: the seed has no rule; keep serving
        return self.i

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        self.window[node].append(int(total_ms * 1000.0))  # microseconds, as the seed stores them

    @staticmethod
    def percentile(sorted_w: list, p: float):
        idx = round(p / 100.0 * (len(sorted_w) - 1))
        return sorted_w[min(idx, len(sorted_w) - 1)]

    def values(self, live: list[int]) -> dict[int, list]:
        """Each live node's window as the values the ratio test reads."""
        return {i: list(self.window[i]) for i in live}

    def on_tick(self, now: float) -> None:
        ctx = self.ctx
        live = [i for i in range(ctx.n) if ctx.members[i] and not self.removed[i]]
        windows = self.values(live)
        stats: dict[int, tuple] = {}
        for i in live:
            if len(windows[i]) >= self.MIN_SAMPLES:
                s = sorted(windows[i])
                stats[i] = (self.percentile(s, 50.0), self.percentile(s, 99.0))
        p50s = [p50 for p50, _ in stats.values() if p50 > 0]
        median_p50 = float(np.median(p50s)) if p50s else 0.0
        for i in live:
            if i not in stats or stats[i][0] == 0:
                continue  # InsufficientData
            p50, p99 = stats[i]
            anomalous = p99 / p50 > self.RATIO or (median_p50 > 0 and p50 > self.CROSS_P50 * median_p50)
            if anomalous:
                self.anomalous_windows[i] += 1
                if self.anomalous_windows[i] >= self.SUSPECT_WINDOWS:
                    self.status[i] = "unhealthy"
                    self.removed[i] = True
                    ctx.note(i, now, 0.0, True)
                else:
                    self.status[i] = "suspect"
            else:
                self.status[i] = "healthy"
                self.anomalous_windows[i] = 0
            if i in ctx.tracked:
                ctx.trace(i, now, p99 / p50, 0.0 if self.removed[i] else 1.0)


class SeedP99P50Norm(SeedP99P50):
    """Seed 001's rule on the normalised per-token latency ``default`` reads (module docstring)."""

    name = "seed_p99p50_norm"

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        decode = math.nan
        if status == STATUS_OK and completion >= 2 and math.isfinite(ttft_ms):
            decode = (total_ms - ttft_ms) / (completion - 1)
        self.window[node].append((decode, seed.t_norm(prompt, completion, total_ms)))

    def values(self, live: list[int]) -> dict[int, list]:
        pairs = {i: np.asarray(self.window[i], dtype=np.float64).reshape(-1, 2) for i in live}
        both = np.concatenate(list(pairs.values())) if pairs else np.zeros((0, 2))
        dec = both[:, 0][np.isfinite(both[:, 0])]
        med_dec = float(np.median(dec)) if len(dec) else math.nan
        med_norm = float(np.median(both[:, 1])) if len(both) else math.nan
        out = {}
        for i, w in pairs.items():
            v = np.where(np.isfinite(w[:, 0]), w[:, 0] / med_dec, w[:, 1] / med_norm)
            out[i] = v[np.isfinite(v)].tolist()
        return out


BASELINE_POLICIES = {
    "round_robin": RoundRobin,
    "least_conn": LeastConn,
    "p2c_ewma": P2CEwma,
    "envoy_errors": EnvoyErrors,
    "seed_zscore": SeedZScore,
    "seed_p99p50": SeedP99P50,
    "seed_p99p50_norm": SeedP99P50Norm,
}
#: What each policy reads to decide (the report prints it next to its figures).
POLICY_INPUTS = {
    "round_robin": "nothing (no feedback)",
    "least_conn": "open connections per node",
    "p2c_ewma": "open connections; access-log total latency",
    "envoy_errors": "access-log status (5xx and client timeouts)",
    "seed_zscore": "access-log total latency and token counts (T_norm, w = 0.25); canary probes",
    "seed_p99p50": "access-log raw total latency",
    "seed_p99p50_norm": "access log: decode ms per output token (total - TTFT), else T_norm, each over the group's median",
    "default_logs": "access log: latency, TTFT, token counts, status; canary probes",
    "default": "access log as default_logs, and every node's /metrics each scrape (inter-token and prefill "
               "histograms, running and waiting requests, KV-cache usage); canary probes",
    "default_lc": "as default (weighted least connections at the gateway)",
}
ALL_POLICIES = (*BASELINE_POLICIES, "default_logs", "default")
#: Run only when named (``--policies``): ``default_lc`` is ``default`` behind a gateway that balances
#: by weighted least connections instead of weighted round robin (the same detector and weights).
OPTIONAL_POLICIES = ("default_lc",)
KNOWN_POLICIES = (*ALL_POLICIES, *OPTIONAL_POLICIES)


def policy_factory(name: str, options: dict | None = None):
    """Factory ``GroupContext -> Policy`` for a policy name (``default`` imports the detector lazily)."""
    if name in BASELINE_POLICIES:
        return BASELINE_POLICIES[name]
    if name in ("default", "default_logs", "default_lc"):
        from sim.default_policy import make_default_policy

        return make_default_policy(options or {}, logs_only=name == "default_logs",
                                   balancer="leastconn" if name == "default_lc" else "round_robin")
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(KNOWN_POLICIES)})")


__all__ = ["ALL_POLICIES", "KNOWN_POLICIES", "OPTIONAL_POLICIES", "POLICY_INPUTS", "STATUS_OK",
           "policy_factory"]
