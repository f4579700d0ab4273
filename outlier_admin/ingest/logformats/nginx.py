"""nginx / ingress-nginx access logs with upstream fields, plus optional token counts.

Expected ``log_format`` (ingress-nginx's default ``log-format-upstream``), optionally followed by
``key=value`` extras that carry what nginx cannot know by itself (token counts, TTFT)::

    $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    "$http_user_agent" $request_length $request_time [$proxy_upstream_name]
    [$proxy_alternative_upstream_name] $upstream_addr $upstream_response_length
    $upstream_response_time $upstream_status $req_id
    prompt_tokens=$upstream_http_x_prompt_tokens completion_tokens=$upstream_http_x_completion_tokens
    ttft_ms=$upstream_http_x_ttft_ms

Retries log lists (``"10.0.0.1:80, 10.0.0.2:80"`` with matching time and status lists): the
*last* upstream answered the client, so the record describes it (its own response time and
status). ``total_ms`` is that upstream's ``$upstream_response_time`` (the node's time, without
gateway queueing), else ``$request_time``. ``ts`` is ``$time_local`` (nginx logs at request end).
A line without token counts raises ``no_token_counts`` (nginx alone cannot normalise latency).
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Any

from outlier_admin.ingest.logformats import NodeMap, ParseError, map_node

_LIST = r"[^\s,]+(?:, [^\s,]+)*"
_LINE = re.compile(
    r'^(?P<remote_addr>\S+) - (?P<remote_user>\S+) \[(?P<time_local>[^\]]+)\] "(?P<request>[^"]*)" '
    r'(?P<status>\d{3}) (?P<body_bytes_sent>\S+) "(?P<referer>[^"]*)" "(?P<user_agent>[^"]*)" '
    r"(?P<request_length>\S+) (?P<request_time>\S+) \[(?P<upstream_name>[^\]]*)\] "
    r"\[(?P<alt_upstream_name>[^\]]*)\] "
    rf"(?P<upstream_addr>{_LIST}) (?P<upstream_response_length>{_LIST}) "
    rf"(?P<upstream_response_time>{_LIST}) (?P<upstream_status>{_LIST}) (?P<req_id>\S+)"
    r"(?: (?P<extra>.*))?$"
)
_EXTRA = re.compile(r"(\w+)=(\S+)")


def valid_upstream(address: str) -> bool:
    """``host:port`` / ``[v6]:port`` with a port in 1..65535, or a ``unix:`` socket path."""
    if address.startswith("unix:"):
        return len(address) > 5
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535 or not host:
        return False
    if host.startswith("["):
        if not host.endswith("]"):
            return False
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
    return True


def parse_fields(line: str) -> dict[str, Any]:
    """The raw fields of one line (strings; upstream lists split into Python lists)."""
    m = _LINE.match(line.rstrip("\r\n"))
    if m is None:
        raise ParseError("bad_format", "line does not match the ingress-nginx upstream log format")
    fields: dict[str, Any] = m.groupdict()
    for key in ("upstream_addr", "upstream_response_length", "upstream_response_time", "upstream_status"):
        fields[key] = fields[key].split(", ")
    fields["extra"] = dict(_EXTRA.findall(fields.get("extra") or ""))
    return fields


def _float(value: str, field: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ParseError(f"bad_{field}", f"{field} {value!r} is not a number") from None


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One access-log line -> ingest record (see module docstring)."""
    f = parse_fields(line)
    upstream = f["upstream_addr"][-1]
    if upstream == "-":
        raise ParseError("no_upstream", "no $upstream_addr: the request did not reach a node")
    if not valid_upstream(upstream):
        raise ParseError("bad_upstream_addr", f"{upstream!r} is not host:port, [ipv6]:port or unix:path")
    extra = f["extra"]
    if "prompt_tokens" not in extra or "completion_tokens" not in extra:
        raise ParseError("no_token_counts", "no prompt_tokens=/completion_tokens= in the line")
    times = f["upstream_response_time"]
    last_time = times[-1] if len(times) == len(f["upstream_addr"]) else "-"
    total_s = _float(last_time if last_time != "-" else f["request_time"], "request_time")
    statuses = f["upstream_status"]
    last_status = statuses[-1] if len(statuses) == len(f["upstream_addr"]) else "-"
    status = int(last_status) if last_status.isdigit() else int(f["status"])
    try:
        ts = datetime.strptime(f["time_local"], "%d/%b/%Y:%H:%M:%S %z").timestamp()
    except ValueError:
        raise ParseError("bad_time_local", f"time_local {f['time_local']!r}") from None
    ttft = extra.get("ttft_ms")
    return {
        "ts": ts,
        "node": map_node(upstream, node_map),
        "group": extra.get("group"),
        "prompt_tokens": _float(extra["prompt_tokens"], "prompt_tokens"),
        "completion_tokens": _float(extra["completion_tokens"], "completion_tokens"),
        "ttft_ms": None if ttft in (None, "-") else _float(ttft, "ttft_ms"),
        "total_ms": total_s * 1000.0,
        "status": status,
        "request_id": f["req_id"] if f["req_id"] != "-" else None,
    }
