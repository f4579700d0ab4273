"""Gateway policies compared by the benchmark (one instance per model group).

Baselines without outlier detection: ``round_robin``, ``least_conn`` (fewest open connections, random
tie-break), ``p2c_ewma`` (Finagle/Linkerd peak-EWMA power of two choices).

``envoy_errors``: Envoy outlier detection with its defaults, errors only: ``consecutive_5xx = 5``
(timeouts count, as locally-originated 5xx do by default), ejection for ``30 s * times ejected``,
at most ``max_ejection_percent = 10`` % of hosts ejected, un-ejection checked every ``interval = 10 s``;
round robin over the remaining hosts.

``seed_zscore``: seed 000's Go controller as written: per node EMA (alpha 0.15, first sample
initialises) of ``T_norm = T_total / (N_prompt * 0.25 + N_completion)`` over every access-log line
(it has no notion of status: a fast error is a fast sample), every 200 ms a baseline over
non-quarantined nodes with more than 5 samples (needs >= 3), population sd,
``Z = (EMA - mean) / (sd + 1e-6)``; ``Z >= 3.5`` on 3 consecutive evaluations -> weight 0 forever (the
seed's canary is described but never implemented); ``2 <= Z < 3.5`` -> ``int(100 * 2^-(Z-2))``, min 1;
below 2 a degraded node is restored to 100. The seed's ``Route()`` always returns the max-weight node
(a bug: it would send all traffic to one node), so we route with smooth weighted round robin over the
seed's weights, and with all weights 0 to ``nodes[0]`` as its fallback does.

``seed_p99p50``: seed 001's Rust health checker as written: per node a window of the last 1,000 raw
latencies; every 30 s, a node with < 100 samples is InsufficientData; ``P99/P50 > 3.0`` (nearest-rank
percentile ``sorted[round(p/100*(len-1))]``) or, per its heterogeneity section, ``P50 > 2 * median of the
nodes' P50`` marks it Suspect; still anomalous 90 s (3 windows of 30 s) after becoming Suspect -> Unhealthy,
removed from the LB; a normal window returns it to Healthy. Removed nodes are no longer analysed, so
its ``probe_quarantined`` never re-adds them (as written). Round robin over the active nodes.
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np

from sim.engine import STATUS_OK, STATUS_TIMEOUT, GroupContext, Policy


class Swrr:
    """nginx smooth weighted round robin, vectorised: ``cw += w; i = argmax(cw); cw[i] -= sum(w)``.

    Zero-weight nodes are parked at a very negative current weight so they are never picked. With
    equal weights this is plain round robin.
    """

    PARK = -1e18

    def __init__(self, weights: np.ndarray) -> None:
        self.w = np.zeros(len(weights))
        self.cw = np.full(len(weights), self.PARK)
        self.total = 0.0
        self.set_weights(weights)

    def set_weights(self, weights: np.ndarray) -> None:
        w = np.asarray(weights, dtype=np.float64)
        was_parked = self.w <= 0
        self.w = np.where(w > 0, w, 0.0)
        self.cw = np.where(self.w > 0, np.where(was_parked, 0.0, self.cw), self.PARK)
        self.total = float(self.w.sum())

    def pick(self) -> int:
        cw = self.cw
        cw += self.w
        i = int(cw.argmax())
        cw[i] -= self.total
        return i


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


class SeedZScore(Policy):
    name = "seed_zscore"
    wants_records = True
    tick_s = 0.2
    ALPHA = 0.15
    W = 0.25
    BASE = 100

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        n = ctx.n
        self.ema = [0.0] * n
        self.samples = [0] * n
        self.state = [0] * n  # 0 healthy, 1 degraded, 2 quarantined
        self.weight = [self.BASE if ctx.members[i] else 0 for i in range(n)]
        self.slow = [0] * n
        self.swrr = Swrr(np.asarray(self.weight, dtype=np.float64))

    def add_node(self, node: int, now: float) -> None:
        self.weight[node] = self.BASE
        self.swrr.set_weights(np.asarray(self.weight, dtype=np.float64))

    def pick(self, now: float) -> int:
        if self.swrr.total <= 0:
            return 0  # the seed's fallback: d.nodes[0]
        return self.swrr.pick()

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        x = total_ms / (prompt * self.W + completion)
        if self.samples[node] == 0:
            self.ema[node] = x
        else:
            self.ema[node] = self.ALPHA * x + (1 - self.ALPHA) * self.ema[node]
        self.samples[node] += 1

    def on_tick(self, now: float) -> None:
        ctx = self.ctx
        members = ctx.members
        active = [self.ema[i] for i in range(ctx.n)
                  if members[i] and self.state[i] != 2 and self.samples[i] > 5]
        if len(active) < 3:
            return
        mean = sum(active) / len(active)
        std = math.sqrt(sum((v - mean) ** 2 for v in active) / len(active))
        changed = False
        for i in range(ctx.n):
            if not members[i] or self.samples[i] <= 5:
                continue
            z = (self.ema[i] - mean) / (std + 1e-6)
            if self.state[i] == 2:
                if i in ctx.tracked:
                    ctx.trace(i, now, z, 0.0)
                continue
            old_w = self.weight[i]
            if z >= 3.5:
                self.slow[i] += 1
                if self.slow[i] >= 3:
                    self.state[i] = 2
                    self.weight[i] = 0
                    self.slow[i] = 0
            elif z >= 2.0:
                self.state[i] = 1
                self.weight[i] = max(1, int(self.BASE * 2.0 ** (-(z - 2.0))))
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


class SeedP99P50(Policy):
    name = "seed_p99p50"
    wants_records = True
    tick_s = 30.0
    WINDOW = 1000
    MIN_SAMPLES = 100
    RATIO = 3.0
    SUSPECT_S = 30.0 * 3
    CROSS_P50 = 2.0

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        n = ctx.n
        self.window: list[deque[int]] = [deque(maxlen=self.WINDOW) for _ in range(n)]
        self.status = ["unknown"] * n
        self.suspect_since: list[float | None] = [None] * n
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
    def percentile(sorted_w: list[int], p: float) -> int:
        idx = round(p / 100.0 * (len(sorted_w) - 1))
        return sorted_w[min(idx, len(sorted_w) - 1)]

    def on_tick(self, now: float) -> None:
        ctx = self.ctx
        live = [i for i in range(ctx.n) if ctx.members[i] and not self.removed[i]]
        stats: dict[int, tuple[int, int]] = {}
        for i in live:
            if len(self.window[i]) >= self.MIN_SAMPLES:
                s = sorted(self.window[i])
                stats[i] = (self.percentile(s, 50.0), self.percentile(s, 99.0))
        p50s = [p50 for p50, _ in stats.values() if p50 > 0]
        median_p50 = float(np.median(p50s)) if p50s else 0.0
        for i in live:
            if i not in stats or stats[i][0] == 0:
                continue  # InsufficientData
            p50, p99 = stats[i]
            anomalous = p99 / p50 > self.RATIO or (median_p50 > 0 and p50 > self.CROSS_P50 * median_p50)
            if anomalous:
                if self.status[i] == "suspect":
                    since = self.suspect_since[i]
                    if since is not None and now - since >= self.SUSPECT_S:
                        self.status[i] = "unhealthy"
                        self.removed[i] = True
                        ctx.note(i, now, 0.0, True)
                elif self.status[i] != "unhealthy":
                    self.status[i] = "suspect"
                    self.suspect_since[i] = now
            else:
                self.status[i] = "healthy"
                self.suspect_since[i] = None
            if i in ctx.tracked:
                ctx.trace(i, now, p99 / p50, 0.0 if self.removed[i] else 1.0)


BASELINE_POLICIES = {
    "round_robin": RoundRobin,
    "least_conn": LeastConn,
    "p2c_ewma": P2CEwma,
    "envoy_errors": EnvoyErrors,
    "seed_zscore": SeedZScore,
    "seed_p99p50": SeedP99P50,
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


__all__ = ["ALL_POLICIES", "KNOWN_POLICIES", "OPTIONAL_POLICIES", "STATUS_OK", "Swrr", "policy_factory"]
