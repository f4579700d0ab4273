"""HAProxy integration through the runtime API (the stats socket).

Per apply: ``show servers state <backend>`` reads the servers (name, address, user weight, admin
state), ``plan_changes`` (pure) diffs them against the effective weights, and only the differences
are sent, one runtime-API command per connection so that an error is attributed to its command:

* quarantined node (weight 0 or a quarantine state): ``set server B/S state drain`` then
  ``set server B/S weight 0``;
* any other node: ``set server B/S state ready`` if the agent had drained it, then
  ``set server B/S weight N`` with ``N = max(1, round(weight * full_weight / base_weight))``
  (HAProxy weights are 0..256; ``full_weight`` (default 256) is the HAProxy weight of a node at its
  base weight; a soft-degraded node never rounds down to 0, so it keeps its sampling trickle).

Servers are matched to nodes by address (``srv_addr:srv_port``, or ``srv_fqdn:srv_port`` when the
document uses host names). Servers matching no node are left alone and reported. A server an operator
put in maintenance (``disable server`` / ``set server ... state maint``) is never set ``ready`` by the
agent: maintenance belongs to humans, drain belongs to the agent.

Safeguard: when the runtime API accepts it (HAProxy >= 2.4 ``experimental-mode on; set var``), the flag is published as the
process variable ``proc.outlier_safeguard`` (0/1) so an admission-control rule can use it, e.g.
``http-request deny deny_status 429 if { var(proc.outlier_safeguard) -m int 1 } { sc_http_req_rate(0) gt 100 }``.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from agent.base import ApplyError, ApplyResult
from agent.client import EffectiveWeights
from contract.weights_document import split_address

log = logging.getLogger("agent.haproxy")

HAPROXY_MAX_WEIGHT = 256
# srv_admin_state bits (HAProxy include/haproxy/server-t.h, enum srv_admin).
ADMF_FMAINT = 0x01
ADMF_IMAINT = 0x02
ADMF_CMAINT = 0x04
ADMF_FDRAIN = 0x08
ADMF_IDRAIN = 0x10
ADMF_RMAINT = 0x20
ADMF_HMAINT = 0x40
_MAINT = ADMF_FMAINT | ADMF_IMAINT | ADMF_CMAINT | ADMF_RMAINT | ADMF_HMAINT


class RuntimeAPIError(ApplyError):
    """The runtime API answered a command with an error message."""


@dataclass(frozen=True)
class ServerState:
    """One line of ``show servers state``."""

    backend: str
    name: str
    addr: str
    port: int
    uweight: int
    admin_state: int
    fqdn: str = "-"

    @property
    def drained(self) -> bool:
        return bool(self.admin_state & ADMF_FDRAIN)

    @property
    def in_maintenance(self) -> bool:
        return bool(self.admin_state & _MAINT)


def haproxy_weight(weight: int, base_weight: int, full_weight: int = HAPROXY_MAX_WEIGHT) -> int:
    """Map our ``0..base_weight`` onto HAProxy's ``0..256``: 0 stays 0, anything else is >= 1."""
    if weight <= 0:
        return 0
    return min(HAPROXY_MAX_WEIGHT, max(1, round(weight * full_weight / base_weight)))


class RuntimeAPI:
    """Minimal client for HAProxy's runtime API (``stats socket``): one command per connection.

    ``address`` is a UNIX socket path, or ``host:port`` for a TCP stats socket.
    """

    def __init__(self, address: str, timeout_s: float = 2.0) -> None:
        self.address = address
        self.timeout_s = timeout_s

    def command(self, cmd: str, *, prefix: str = "") -> str:
        """Send ``cmd`` (optionally after ``prefix;`` e.g. ``experimental-mode on``); return the answer."""
        if "\n" in cmd or ";" in cmd:
            raise ValueError("one runtime-API command at a time")
        if prefix:
            cmd = f"{prefix}; {cmd}"
        try:
            if self.address.startswith("/") or self.address.startswith("."):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                target: str | tuple[str, int] = self.address
            else:
                host, port = split_address(self.address)
                sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
                target = (host, port)
            with sock:
                sock.settimeout(self.timeout_s)
                sock.connect(target)
                sock.sendall(cmd.encode() + b"\n")
                chunks = []
                while True:  # non-interactive mode: HAProxy closes after the answer
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
        except OSError as exc:
            raise ApplyError(f"HAProxy runtime API {self.address} unreachable: {exc}") from exc
        return b"".join(chunks).decode("utf-8", "replace")

    def show_servers_state(self, backend: str) -> list[ServerState]:
        return parse_servers_state(self.command(f"show servers state {backend}"))

    def run(self, cmd: str, *, prefix: str = "") -> None:
        """Run a command that prints nothing on success; raise RuntimeAPIError with its message."""
        out = self.command(cmd, prefix=prefix).strip()
        if out:
            raise RuntimeAPIError(f"{cmd!r}: {out}")


def parse_servers_state(text: str) -> list[ServerState]:
    """Parse ``show servers state`` output (version line, ``# field names`` header, one row each).

    Columns are looked up by name from the header, so versions adding columns still parse.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header: list[str] | None = None
    servers: list[ServerState] = []
    for ln in lines:
        if ln.startswith("#"):
            header = ln.lstrip("#").split()
            continue
        if header is None:
            if ln.strip().isdigit():  # the format version line ("1")
                continue
            raise ApplyError(f"unexpected 'show servers state' output: {ln.strip()!r}")
        fields = ln.split()
        if len(fields) < len(header):
            raise ApplyError(f"short 'show servers state' row: {ln.strip()!r}")
        row = dict(zip(header, fields, strict=False))
        servers.append(
            ServerState(
                backend=row["be_name"],
                name=row["srv_name"],
                addr=row["srv_addr"],
                port=int(row.get("srv_port", "0")),
                uweight=int(row["srv_uweight"]),
                admin_state=int(row["srv_admin_state"]),
                fqdn=row.get("srv_fqdn", "-"),
            )
        )
    if header is None:
        raise ApplyError(f"unexpected 'show servers state' output: {text.strip()[:200]!r}")
    return servers


def plan_changes(
    servers: list[ServerState], weights: EffectiveWeights, full_weight: int = HAPROXY_MAX_WEIGHT
) -> tuple[list[str], ApplyResult]:
    """Runtime-API commands that bring ``servers`` to ``weights`` (pure; only the differences).

    Returns ``(commands, result)`` where ``result`` lists unknown servers and missing nodes.
    """
    by_addr: dict[tuple[str, int], ServerState] = {}
    for srv in servers:
        by_addr[(srv.addr, srv.port)] = srv
        if srv.fqdn not in ("-", ""):
            by_addr.setdefault((srv.fqdn, srv.port), srv)
    result = ApplyResult()
    commands: list[str] = []
    matched: set[str] = set()
    for node in weights.nodes:
        srv = by_addr.get(split_address(node.address))
        if srv is None:
            result.missing.append(f"{node.node} ({node.address})")
            continue
        matched.add(srv.name)
        ref = f"{srv.backend}/{srv.name}"
        if node.quarantined:
            if not srv.drained and not srv.in_maintenance:
                commands.append(f"set server {ref} state drain")
            if srv.uweight != 0:
                commands.append(f"set server {ref} weight 0")
            continue
        if srv.drained and not srv.in_maintenance:
            commands.append(f"set server {ref} state ready")
        target = haproxy_weight(node.weight, node.base_weight, full_weight)
        if srv.uweight != target:
            commands.append(f"set server {ref} weight {target}")
    result.unknown = [f"{s.backend}/{s.name} ({s.addr}:{s.port})" for s in servers if s.name not in matched]
    return commands, result


class HAProxyApplier:
    """Applies effective weights to one HAProxy backend through its runtime API."""

    name = "haproxy"

    def __init__(self, socket_address: str, backend: str, full_weight: int = HAPROXY_MAX_WEIGHT,
                 timeout_s: float = 2.0) -> None:
        if not 1 <= full_weight <= HAPROXY_MAX_WEIGHT:
            raise ValueError(f"full_weight must be in 1..{HAPROXY_MAX_WEIGHT}")
        self.api = RuntimeAPI(socket_address, timeout_s)
        self.backend = backend
        self.full_weight = full_weight
        self._safeguard_supported = True

    def apply(self, weights: EffectiveWeights) -> ApplyResult:
        servers = self.api.show_servers_state(self.backend)
        if not servers:
            raise ApplyError(f"HAProxy backend {self.backend!r} has no servers (or does not exist)")
        commands, result = plan_changes(servers, weights, self.full_weight)
        for cmd in commands:
            self.api.run(cmd)
            result.changes.append(cmd)
        return result

    def set_safeguard(self, active: bool) -> None:
        if not self._safeguard_supported:
            return
        try:
            # 'set var' is an experimental runtime-API command in HAProxy 2.4-2.8.
            self.api.run(f"set var proc.outlier_safeguard int({int(active)})", prefix="experimental-mode on")
        except RuntimeAPIError as exc:
            # Older HAProxy (< 2.4) or a build without it: the flag stays in logs and metrics.
            self._safeguard_supported = False
            log.info("HAProxy does not take 'set var' (%s); safeguard only in logs/metrics", exc)
