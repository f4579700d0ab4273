"""Gateway log shipper: access-log lines -> ingest records -> ``POST /api/v1/ingest/requests``.

Runs on the gateway host, next to the agent; standard library only (plus the
``contract.logformats`` parsers, which decode JSON with orjson when it is installed and
with the standard library's ``json`` otherwise). Lines come from HAProxy's UDP
syslog (``log 127.0.0.1:5514 local0`` in its ``global`` section; :func:`serve_udp`) or from an
access-log file (:func:`tail_file`). Every format :mod:`contract.logformats` reads is read
with no custom configuration — nginx ``combined`` (+ ``$request_time $upstream_addr
$upstream_response_time``), Envoy's default text format, HAProxy's default ``httplog``, LiteLLM's
``StandardLoggingPayload``, OpenAI-style JSON with a nested ``usage`` — and the default format
``auto`` recognises each line's; lines without token counts become latency-only records. Parsed
records are batched and POSTed as a JSON array with ``Authorization: Bearer <token>``.

``outlier-shipper --ingest-url URL (--udp HOST:PORT | --file PATH)`` runs it (the console script of
``outlier-admin-agent``; ``python -m agent.shipper`` in any install; token in
``OUTLIER_SHIPPER_TOKEN``, never on the command line).

HAProxy logs server *names*; the ingest pipeline resolves node *addresses*. ``node_map_from_haproxy``
reads ``show servers state`` once at start (and on ``refresh_node_map``) and maps ``backend/server``
to ``addr:port`` so each record's ``node`` is the address the control plane knows.

Nothing is lost silently: lines that do not parse are counted by reason and the last ones kept
(``rejected``: reason, the format the line looks like, the line; logged once per reason and format);
a batch the API refuses or cannot take stays buffered (bounded) and is retried.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.haproxy import RuntimeAPI
from contract.logformats import (
    LABELS,
    LINE_TOO_LONG,
    MAX_LINE_BYTES,
    ParseError,
    get_parser,
    too_long_error,
)

log = logging.getLogger("agent.shipper")
# At most this much of a file is read per poll (a file that grew by gigabytes is read in steps).
READ_BYTES = 8 * 1024 * 1024


def node_map_from_haproxy(api: RuntimeAPI, backend: str) -> dict[str, str]:
    """``{"<backend>/<server>": "<addr>:<port>"}`` from the runtime API."""
    return {f"{s.backend}/{s.name}": f"{s.addr}:{s.port}" for s in api.show_servers_state(backend)}


class LogShipper:
    """Parse access-log lines and ship the records to the ingest API in batches. ``parser``: a
    format name of ``logformats.FORMATS`` (default ``auto``) or a ``parse_line`` function."""

    def __init__(self, ingest_url: str, token: str, *, node_map: dict[str, str] | None = None,
                 group: str | None = None, batch_size: int = 500, max_buffer: int = 100_000,
                 timeout_s: float = 5.0, parser: Callable[..., dict[str, Any]] | str = "auto") -> None:
        self.parser = get_parser(parser) if isinstance(parser, str) else parser
        self.ingest_url = ingest_url
        self.token = token
        self.node_map = node_map or {}
        self.group = group
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.buffer: deque[dict[str, Any]] = deque(maxlen=max_buffer)
        self.rejected: deque[tuple[str, str]] = deque(maxlen=1000)  # (reason, line)
        self.rejected_by_reason: Counter[str] = Counter()
        self.rejected_by_format: Counter[tuple[str, str]] = Counter()  # (reason, format it looks like)
        self.shipped = 0
        self.post_errors = 0
        self.dropped = 0  # records the API refused for good (400/415, or one record over 413)
        self.last_response: dict[str, Any] | None = None
        self.last_error = ""  # the last line skipped for its length (skip_long_line)
        self._lock = threading.Lock()

    def feed(self, line: str) -> bool:
        """Parse one line; True if it became a record (buffered for the next flush)."""
        try:
            rec = self.parser(line, node_map=self.node_map)
        except ParseError as exc:
            reason = getattr(exc, "reason", "bad_format")
            fmt = getattr(exc, "fmt", "")
            if not self.rejected_by_format[(reason, fmt)]:  # the first of its kind: say what and why
                log.warning("line refused: %s%s: %s", reason, f" ({LABELS.get(fmt, fmt)})" if fmt else "",
                            exc.detail or "")
            self.rejected_by_reason[reason] += 1
            self.rejected_by_format[(reason, fmt)] += 1
            self.rejected.append((reason, line))
            return False
        if self.group:
            rec["group"] = self.group
        with self._lock:
            self.buffer.append(rec)
            full = len(self.buffer) >= self.batch_size
        if full:
            self.flush()
        return True

    def skip_long_line(self, sample: bytes, size: int | str) -> None:
        """Count a line over :data:`MAX_LINE_BYTES` that the file tail skipped unread (``line_too_long``,
        like the parsers' refusal of one given whole), keep its first bytes, say it in ``last_error``."""
        exc = too_long_error(size)
        self.last_error = exc.detail
        if not self.rejected_by_format[(LINE_TOO_LONG, "")]:
            log.warning("line refused: %s: %s", LINE_TOO_LONG, exc.detail)
        self.rejected_by_reason[LINE_TOO_LONG] += 1
        self.rejected_by_format[(LINE_TOO_LONG, "")] += 1
        self.rejected.append((LINE_TOO_LONG, sample.decode("utf-8", "replace")))

    def flush(self) -> int:
        """POST everything buffered, ``batch_size`` records a request; returns how many records the
        API took. Records a retry may still deliver are kept (see :meth:`_refused`)."""
        sent = 0
        while True:
            with self._lock:
                batch = [self.buffer.popleft() for _ in range(min(len(self.buffer), self.batch_size))]
            if not batch:
                return sent
            outcome = self._post(batch)
            if outcome is None:  # kept for the next flush
                return sent
            sent += outcome

    def _post(self, batch: list[dict[str, Any]]) -> int | None:
        """One POST: the number of records taken, 0 when refused for good, None when kept."""
        req = urllib.request.Request(
            self.ingest_url, data=json.dumps(batch).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                self.last_response = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return self._refused(batch, exc)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.post_errors += 1
            log.warning("ingest POST failed (%s); keeping %d records for retry", exc, len(batch))
            self._keep(batch)
            return None
        self.shipped += len(batch)
        return len(batch)

    def _keep(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            self.buffer.extendleft(reversed(batch))

    def _refused(self, batch: list[dict[str, Any]], exc: urllib.error.HTTPError) -> int | None:
        """An HTTP answer other than 200. A body the API will never take must not block the records
        behind it forever: 413 halves the batch size (one record over the limit is dropped, counted);
        400 and 415 drop the batch (counted, logged with the API's reason). Everything else — 401/403
        (a token an operator will fix), 408, 429, 5xx — keeps the records for the next flush."""
        self.post_errors += 1
        detail = exc.read()[:300].decode("utf-8", "replace") if exc.fp else ""
        if exc.code == 413 and len(batch) > 1:
            self.batch_size = max(1, len(batch) // 2)
            log.warning("ingest answered 413 for %d records; sending batches of %d", len(batch), self.batch_size)
            self._keep(batch)
            return 0  # not kept back: the next, smaller request goes now
        if exc.code in (400, 413, 415):
            self.dropped += len(batch)
            log.error("ingest refused %d records for good (HTTP %d: %s); dropped", len(batch), exc.code, detail)
            return 0
        log.warning("ingest answered HTTP %d (%s); keeping %d records for retry", exc.code, detail, len(batch))
        self._keep(batch)
        return None

def serve_udp(shipper: LogShipper, sock: socket.socket, stop: threading.Event,
              flush_interval_s: float = 1.0) -> None:
    """Read syslog datagrams from ``sock`` until ``stop``; flush at least every ``flush_interval_s``."""
    sock.settimeout(min(flush_interval_s, 0.5))
    last_flush = 0.0
    while not stop.is_set():
        try:
            data = sock.recv(65536)
        except TimeoutError:
            data = b""
        except OSError:
            break
        if data:
            shipper.feed(data.decode("utf-8", "replace").rstrip("\n"))
        if time.monotonic() - last_flush >= flush_interval_s:
            shipper.flush()
            last_flush = time.monotonic()
    shipper.flush()


def tail_file(shipper: LogShipper, path: str | Path, stop: threading.Event, *,
              flush_interval_s: float = 1.0, poll_s: float = 0.1, start_offset: int | None = None) -> None:
    """Follow an access-log file (e.g. nginx's, with ``parser=nginx.parse_line``) from
    ``start_offset`` (default: its current end) until ``stop``; flush at least every
    ``flush_interval_s``. A partial last line is kept until its newline arrives; a truncated or
    replaced file is re-read from its start. A line over ``logformats.MAX_LINE_BYTES`` is dropped to
    its newline unread and counted (:meth:`LogShipper.skip_long_line`): it never stops the tail, and
    the unfinished rest held in memory stays under the cap."""
    path = Path(path)
    if start_offset is None:
        start_offset = path.stat().st_size if path.exists() else 0
    offset = start_offset
    pending = b""
    skipping = False  # inside a line over MAX_LINE_BYTES: dropped up to its newline, never read
    last_flush = time.monotonic()
    while not stop.is_set():
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < offset:  # rotated or truncated
            offset, pending, skipping = 0, b"", False
        if size > offset:
            with path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read(min(size - offset, READ_BYTES))
            offset += len(chunk)
            pending, skipping = _feed_chunk(shipper, pending, chunk, skipping)
        if time.monotonic() - last_flush >= flush_interval_s:
            shipper.flush()
            last_flush = time.monotonic()
        if size <= offset:
            stop.wait(poll_s)
    shipper.flush()


def _feed_chunk(shipper: LogShipper, pending: bytes, chunk: bytes, skipping: bool) -> tuple[bytes, bool]:
    """Feed the complete lines of ``pending + chunk``; returns the unfinished rest and whether it is
    inside a line over :data:`MAX_LINE_BYTES` (then dropped, not kept: memory stays under the cap)."""
    start = 0
    if skipping:
        end = chunk.find(b"\n")
        if end < 0:
            return b"", True
        start = end + 1
    data = pending + chunk[start:] if pending else chunk[start:]
    *lines, rest = data.split(b"\n")
    for line in lines:
        if len(line) > MAX_LINE_BYTES:
            shipper.skip_long_line(line[:200], len(line))
        elif line.strip():
            shipper.feed(line.decode("utf-8", "replace"))
    if len(rest) > MAX_LINE_BYTES:
        shipper.skip_long_line(rest[:200], f"over {len(rest)}")
        return b"", True
    return rest, False


def main(argv: list[str] | None = None) -> int:
    """``python -m agent.shipper``: ship one UDP syslog port or one file until SIGTERM."""
    import argparse
    import os
    import signal

    from contract.logformats import FORMATS, parse_node_map

    p = argparse.ArgumentParser(prog="python -m agent.shipper", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ingest-url", required=True, help="http(s)://HOST/api/v1/ingest/requests")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--udp", metavar="HOST:PORT", help="receive syslog datagrams (HAProxy's 'log' target)")
    src.add_argument("--file", help="follow an access-log file from its end")
    p.add_argument("--from-start", action="store_true", help="with --file: ship what the file holds first")
    p.add_argument("--format", choices=sorted(FORMATS), default="auto")
    p.add_argument("--group", help="group for records that do not name one")
    p.add_argument("--node-map", help="K=NODE,... or a JSON object: what lines name (HAProxy backend/server, "
                   "an address) -> node address; '*': the node of lines naming none")
    p.add_argument("--haproxy-socket", help="HAProxy runtime API: key its servers by address")
    p.add_argument("--haproxy-backend", help="backend whose servers to map (with --haproxy-socket)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = os.environ.get("OUTLIER_SHIPPER_TOKEN", "")
    if not token:
        raise SystemExit("set OUTLIER_SHIPPER_TOKEN to an ingest token")
    try:
        node_map = parse_node_map(args.node_map) if args.node_map else {}
    except ValueError as exc:
        raise SystemExit(f"--node-map: {exc}") from None
    if args.haproxy_socket:
        if not args.haproxy_backend:
            raise SystemExit("--haproxy-socket needs --haproxy-backend")
        node_map = {**node_map_from_haproxy(RuntimeAPI(args.haproxy_socket), args.haproxy_backend), **node_map}
    shipper = LogShipper(args.ingest_url, token, node_map=node_map, group=args.group, parser=args.format)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.udp:
        host, _, port = args.udp.rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host.strip("[]"), int(port)))
        serve_udp(shipper, sock, stop)
    else:
        tail_file(shipper, args.file, stop, start_offset=0 if args.from_start else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
