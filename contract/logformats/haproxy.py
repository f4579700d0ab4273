"""HAProxy's default HTTP log format (``option httplog``) as an ingest format.

Format (HAProxy configuration manual, section 8.2.3 "HTTP log format")::

    haproxy[14389]: 10.0.1.2:33317 [06/Feb/2009:12:14:14.655] http-in static/srv1 10/0/30/69/109 \
        200 2750 - - ---- 1/1/1/1/0 0/0 {1wt.eu} {} "GET /index.html HTTP/1.1"

i.e. ``%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq
%hr %hs %{+Q}r``. Any syslog prefix before the client address is skipped (BSD syslog, RFC 5424, or
none with ``log stdout format raw``); the captured-header blocks are optional.

Mapping onto an ingest record
-----------------------------
* ``node``: ``node_map["<backend>/<server>"]``, else ``node_map["<server>"]``, else the server name.
  HAProxy's default format logs server *names*, never addresses, while nodes are keyed by address
  (the weights the agent applies name addresses): give the map — the shipper reads it from the
  runtime API (``show servers state``), ``tail_logs --node-map`` takes it explicitly. An unmapped
  name reaches the pipeline as it is: it matches a node registered under that name, and is never
  auto-registered (a name is not an address).
* ``ttft_ms`` = ``Tr``, the time until the server's response headers. HAProxy has no first-token
  timer; for a non-streaming completion Tr is the whole generation, for a streaming one it is the
  time to the first bytes. ``None`` when Tr is -1 (no response headers, e.g. a refused connection).
* ``total_ms`` = ``Ta - TR - Tw``: the active time minus the client's request-upload time (``TR``,
  client network) and HAProxy's queue (``Tw``), i.e. connect + server response + data transfer, the
  part a gray node is responsible for, and never less than ``Tc + Tr``. Timers of -1 count as 0.
* ``status`` = the HTTP status; 5xx produced by HAProxy after a server failure (``SC--``, ``sH--``)
  are kept: they are evidence against that server.
* ``prompt_tokens`` / ``completion_tokens``: HAProxy cannot count tokens. When the servers (or a
  sidecar) return ``X-Prompt-Tokens`` / ``X-Completion-Tokens`` (optionally ``X-TTFT-Ms``) response
  headers and the frontend captures them, in that order, as the *last* captures::

      capture response header X-Prompt-Tokens len 10
      capture response header X-Completion-Tokens len 10
      capture response header X-TTFT-Ms len 10        # optional; overrides Tr as ttft_ms

  the last ``{...}`` block reads ``{12|16|41}`` and gives the counts. Otherwise both are ``None``.
  Clients write the captured *request* headers; HAProxy escapes ``{ | } "`` in them (``#7B`` ...), so
  they cannot close their block or open another, and a line whose blocks hold such a character raw
  is refused. A frontend that captures request headers but no response headers logs one block,
  the clients': do not read tokens from such a frontend (nothing in the line tells the two apart).
  The node (``backend/server``), the timers and the status come before every client field.
* ``ts``: when the request finished, ``%tr + Ta`` (the date its first byte arrived plus the total
  active time), as ISO-8601 UTC: every ingest format stamps a record with its end, the moment the
  gateway learned its latency. HAProxy logs its host's local time without offset; run gateways in UTC
  or ship ``%Ts`` with a custom format.
* ``request_id``: ``"haproxy-"`` + 16 hex of SHA-1 over the log body: stable, so a re-shipped line is
  deduplicated, and distinct lines never collide in practice.

Lines rejected with ``ParseError(reason)``: not an HTTP log line, TCP logs (``option tcplog``),
requests that never reached a server (``<NOSRV>``, ``<STATS>``, ``<CACHE>``), client aborts before a
status (``-1``), and ``option logasap`` lines (``+`` on Ta: the total is only a lower bound and would
bias the latency baseline downwards).
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta

from contract.logformats import ParseError, check_length

NAME = "haproxy"

# The accept date, "[06/Feb/2009:12:14:14.655] ": the first one in the line is HAProxy's own, since
# nothing a client sends comes before it (the syslog prefix, then %ci:%cp). A fixed-length pattern, so
# searching for it costs a constant per character; the client address is the word before it, and
# the rest is matched from the date on (anchored), never searched for.
_DATE = re.compile(r" \[(?P<date>\d{2}/[A-Za-z]{3}/\d{4}:\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)\] ")
# After the date. Every repeat is of a class its separator is not in (a failing match backtracks a
# constant per character). A captured header cannot hold "{", "|", "}" nor '"': HAProxy writes
# them as #7B, #7C, #7D, #22 (and '"' in the request as #22), so a client's header cannot close a
# block or open another; a line where one does was not written by HAProxy's escaping and is refused.
_HTTP_REST = re.compile(
    r"(?P<frontend>\S+) (?P<backend>[^\s/]+)/(?P<server>\S+) "
    r"(?P<TR>-?\d{1,10})/(?P<Tw>-?\d{1,10})/(?P<Tc>-?\d{1,10})/(?P<Tr>-?\d{1,10})/(?P<Ta>\+?-?\d{1,10}) "
    r"(?P<status>-?\d{1,3}) (?P<bytes>\+?\d+) \S+ \S+ (?P<term>\S{4}) "
    r"\d+/\d+/\d+/\d+/\+?\d+ \d+/\d+"
    r'(?P<captures>(?: \{[^{}"]*\}){0,2}) '
    r'"(?P<request>[^"]*)"?$'
)
# option tcplog: three timers (Tw/Tc/Tt), no status code; recognised to give a precise reason.
_TCP_REST = re.compile(r"\S+ \S+ -?\d+/-?\d+/\+?-?\d+ \+?\d+ \S{2} \d+/\d+/\d+/\d+/\+?\d+ \d+/\d+$")
_NO_SERVER = {"<NOSRV>", "<STATS>", "<CACHE>"}
_NOTICE = re.compile(r"haproxy\[\d{1,10}\]: (?:Server|Proxy|Backup Server|backend|Health check) ")


def _body(text: str) -> tuple[int, re.Match[str]] | None:
    """Where the log body starts (the client address) and the accept date, or None."""
    date = _DATE.search(text)
    if date is None:
        return None
    start = max(text.rfind(" ", 0, date.start()), text.rfind("\t", 0, date.start())) + 1
    host, sep, port = text[start:date.start()].rpartition(":")
    if not host or not sep or not port.isdigit() or len(port) > 5:
        return None
    return start, date


def looks_like(text: str) -> bool:
    """Whether ``text`` is an HAProxy HTTP or TCP log line (however it would parse)."""
    check_length(text)
    body = _body(text.strip())
    if body is None:
        return False
    rest = body[1].end()
    return bool(_HTTP_REST.match(text.strip(), rest) or _TCP_REST.match(text.strip(), rest))


def _ms(value: str) -> int:
    return max(0, int(value))


def parse_line(line: str, *, node_map: dict[str, str] | None = None) -> dict:
    """Parse one HAProxy HTTP log line into an ingest record; raise ParseError(reason) otherwise."""
    if not isinstance(line, str):
        raise ParseError("bad_format", "line is not text")
    text = line.strip()
    if not text:
        raise ParseError("empty_line")
    check_length(text)
    body = _body(text)
    match = _HTTP_REST.match(text, body[1].end()) if body is not None else None
    if body is None or match is None:
        if body is not None and _TCP_REST.match(text, body[1].end()):
            raise ParseError("tcp_log", "HAProxy TCP log (option tcplog) has no HTTP status or response timer")
        if _NOTICE.search(text):
            # "Server llm/s3 is going DOWN", "Proxy llm_in started": HAProxy's own events, same target.
            raise ParseError("not_a_request", "an HAProxy notice, not a request log line")
        raise ParseError("bad_format", "not an HAProxy HTTP log line (option httplog default format)")
    g = {**match.groupdict(), "date": body[1]["date"]}
    server = g["server"]
    if server in _NO_SERVER:
        raise ParseError("no_upstream", f"request never reached a server ({server}, termination {g['term']})")
    if g["Ta"].startswith("+"):
        raise ParseError("logasap", "option logasap: Ta is only a lower bound of the total time")
    status = int(g["status"])
    if status < 100:
        raise ParseError("no_status", f"no HTTP status (client aborted, termination {g['term']})")
    try:
        accepted = datetime.strptime(g["date"].split(".")[0], "%d/%b/%Y:%H:%M:%S")
    except ValueError:
        raise ParseError("bad_ts", f"bad accept date {g['date']!r}") from None
    frac = g["date"].partition(".")[2]
    accepted = accepted.replace(microsecond=int(frac.ljust(6, "0")) if frac else 0, tzinfo=UTC)

    tr = int(g["Tr"])
    # Never below what was measured directly (connect + response headers): hand-edited or
    # rounded lines can have Ta < TR + Tw (one of the manual's own examples does).
    total_ms = max(_ms(g["Ta"]) - _ms(g["TR"]) - _ms(g["Tw"]), _ms(g["Tc"]) + _ms(g["Tr"]))
    prompt_tokens, completion_tokens, ttft_override = _token_captures(g["captures"])
    ttft_ms = ttft_override if ttft_override is not None else (float(tr) if tr >= 0 else None)
    node_map = node_map or {}
    backend = g["backend"]
    node = node_map.get(f"{backend}/{server}") or node_map.get(server) or server
    logged = text[body[0]:]
    return {
        "ts": (accepted + timedelta(milliseconds=_ms(g["Ta"]))).isoformat(),
        "node": node,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "ttft_ms": ttft_ms,
        "total_ms": float(total_ms),
        "status": status,
        "request_id": "haproxy-" + hashlib.sha1(logged.encode("utf-8")).hexdigest()[:16],
    }


def _token_captures(captures: str) -> tuple[int | None, int | None, float | None]:
    """Token counts (and optional TTFT) from the last captured-header block, if it holds them."""
    blocks = re.findall(r"\{([^}]*)\}", captures or "")
    if not blocks:
        return None, None, None
    values = blocks[-1].split("|")
    if len(values) < 2 or not values[0].isdigit() or not values[1].isdigit():
        return None, None, None
    ttft: float | None = None
    if len(values) >= 3:
        try:
            ttft = float(values[2])
        except ValueError:
            ttft = None
        if ttft is not None and not (ttft >= 0 and ttft == ttft and ttft != float("inf")):
            ttft = None
    return int(values[0]), int(values[1]), ttft
