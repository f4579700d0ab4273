"""The agent: watch one group's weights (``GatewayClient.run``) and hand them to one applier.

Per update it applies, logs every change, passes the safeguard flag on, keeps counters for the
``outlier_agent_*`` metrics, (optionally) writes a status file for local admission control, and
reports the version it applied back to the control plane (``GatewayClient.report_applied``: the
first screen shows, per group, what the gateways really run). An
apply error is counted, logged, and retried with backoff (1 s doubling to 10 s while the same weights
keep failing; at once for new weights: ``GatewayClient.run``); the gateway keeps its previous
configuration meanwhile. Every ``resync_interval_s`` the current
weights are applied again even if nothing changed: appliers only send differences, so this is cheap
and repairs a gateway that was restarted or edited by hand.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.base import Applier, ApplyError
from agent.client import MODE_FAIL_OPEN, EffectiveWeights, GatewayClient
from agent.nginx import write_atomically

log = logging.getLogger("agent")


@dataclass
class AgentState:
    """What the agent last did; read by the metrics collector and written to the status file."""

    group: str
    gateway: str
    version: int | None = None
    generated_at: float | None = None
    mode: str | None = None
    safeguard: bool = False
    applied_at: float | None = None
    applies: int = 0  # applies that changed something
    apply_errors: int = 0
    unknown: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    last_error: str = ""


class Agent:
    """Glue between a GatewayClient and an Applier (see module docstring)."""

    def __init__(
        self,
        client: GatewayClient,
        applier: Applier,
        *,
        status_file: str | None = None,
        clock: Callable[[], float] = time.time,
        latency_window: int = 10_000,
        gateway_id: str | None = None,
    ) -> None:
        self.client = client
        self.applier = applier
        #: How this gateway is named in the applied-versions report (host and gateway kind by default).
        self.gateway_id = gateway_id or f"{socket.gethostname()}/{applier.name}"
        self.status_file = Path(status_file) if status_file else None
        self.clock = clock
        self.state = AgentState(group=client.group, gateway=applier.name)
        self._safeguard_sent: bool | None = None
        #: (version, seconds from the document's generated_at to the end of its apply), live mode only.
        self.apply_latencies: deque[tuple[int, float]] = deque(maxlen=latency_window)
        #: The same, only for versions whose apply changed the gateway (a decision, not a heartbeat).
        self.change_latencies: deque[tuple[int, float]] = deque(maxlen=latency_window)
        #: (version, applied_at, change) for every change sent to the gateway, in order.
        self.change_log: deque[tuple[int, float, str]] = deque(maxlen=latency_window)
        self._lock = threading.Lock()

    def handle(self, weights: EffectiveWeights) -> None:
        """Apply ``weights``; raise ApplyError after counting it so the watcher retries later."""
        with self._lock:
            st = self.state
            try:
                result = self.applier.apply(weights)
            except (ApplyError, OSError) as exc:
                st.apply_errors += 1
                st.last_error = str(exc)
                log.error("apply failed gateway=%s group=%s version=%s: %s", st.gateway, st.group,
                          weights.version, exc)
                self._write_status()
                raise ApplyError(str(exc)) from exc
            done = self.clock()
            new_version = weights.version != st.version
            if weights.mode != st.mode:
                if weights.mode == MODE_FAIL_OPEN:
                    log.warning("weights of group %s are %.0fs old (> stale_after_s): FAIL OPEN, all nodes "
                                "back at base weight", st.group, weights.age_s)
                elif st.mode is not None:
                    log.warning("fresh weights for group %s again: leaving fail-open", st.group)
            for change in result.changes:
                log.info("applied gateway=%s group=%s version=%s mode=%s: %s", st.gateway, st.group,
                         weights.version, weights.mode, change)
            if result.note:
                log.warning("gateway=%s group=%s version=%s: %s", st.gateway, st.group, weights.version, result.note)
            if result.unknown != st.unknown and result.unknown:
                log.warning("gateway servers not in group %s (left alone): %s", st.group,
                            ", ".join(result.unknown))
            if result.missing != st.missing and result.missing:
                log.warning("nodes of group %s with no gateway server: %s", st.group, ", ".join(result.missing))
            if weights.safeguard != self._safeguard_sent:
                if weights.safeguard:
                    log.warning("SAFEGUARD active for group %s: the control plane stopped quarantining "
                                "(too many outliers); consider admission control", st.group)
                elif self._safeguard_sent:
                    log.info("safeguard cleared for group %s", st.group)
                try:
                    self.applier.set_safeguard(weights.safeguard)
                    self._safeguard_sent = weights.safeguard
                except (ApplyError, OSError) as exc:
                    log.warning("could not pass the safeguard flag to %s: %s", st.gateway, exc)
            if new_version and weights.mode != MODE_FAIL_OPEN:
                self.apply_latencies.append((weights.version, done - weights.generated_at))
                if result.changes:
                    self.change_latencies.append((weights.version, done - weights.generated_at))
            for change in result.changes:
                self.change_log.append((weights.version, done, str(change)))
            if result.changes:
                st.applies += 1
            st.version, st.generated_at, st.mode = weights.version, weights.generated_at, weights.mode
            st.safeguard, st.applied_at = weights.safeguard, done
            st.unknown, st.missing, st.last_error = result.unknown, result.missing, ""
            self._write_status()
            self.client.report_applied(self.gateway_id, weights.version, done, weights.mode)

    def age_s(self) -> float | None:
        """Seconds since the last good document was generated (None before the first one)."""
        doc = self.client.document
        return None if doc is None else self.clock() - doc.generated_at

    def run(self, stop: threading.Event, *, resync_interval_s: float = 30.0) -> None:
        """Watch and apply until ``stop`` is set."""
        log.info("agent started: gateway=%s group=%s key=%s channel=%s", self.applier.name, self.client.group,
                 self.client.key, self.client.channel)
        self.client.run(self.handle, stop, resync_interval_s=resync_interval_s)
        log.info("agent stopped: gateway=%s group=%s", self.applier.name, self.client.group)

    def run_once(self) -> bool:
        """Pull once and apply; False if there was no usable document."""
        self.client.refresh()
        weights = self.client.effective()
        if weights is None:
            log.warning("no usable weights document at %s", self.client.key)
            return False
        self.handle(weights)
        return True

    def _write_status(self) -> None:
        if self.status_file is None:
            return
        body = asdict(self.state) | {"age_s": self.age_s(), "written_at": self.clock()}
        try:
            write_atomically(self.status_file, json.dumps(body, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            log.warning("cannot write status file %s: %s", self.status_file, exc)
