"""nginx access logs: ``combined`` (nginx's default) with optional timing fields, and ingress-nginx.

**combined** (``log_format combined``, what nginx writes with no ``log_format``)::

    $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    "$http_user_agent"

optionally followed by any of ``$request_time``, ``$upstream_addr``, ``$upstream_response_time``, in
that order (``... "$http_user_agent" $request_time $upstream_response_time`` is a common one), and by
``key=value`` fields. Positional fields are told apart by their shape: an address (``host:port``,
``[v6]:port``, ``unix:``) is ``$upstream_addr``; the number before it is ``$request_time``, the one
after it ``$upstream_response_time``; with no address, two numbers are ``$request_time
$upstream_response_time`` and three fields ``$request_time $upstream_addr $upstream_response_time``
(``-`` for no upstream). ``key=value`` fields are read by name: ``rt`` / ``request_time``, ``urt`` /
``upstream_response_time``, ``ua`` / ``upstream_addr``, and what nginx cannot know by itself:
``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``ttft_ms``, ``group``, ``request_id``
(quotes around a value are dropped: ``urt="0.070"``).

**ingress-nginx** (its default ``log-format-upstream``), also followed by optional ``key=value``s::

    $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    "$http_user_agent" $request_length $request_time [$proxy_upstream_name]
    [$proxy_alternative_upstream_name] $upstream_addr $upstream_response_length
    $upstream_response_time $upstream_status $req_id
    prompt_tokens=$upstream_http_x_prompt_tokens completion_tokens=$upstream_http_x_completion_tokens
    ttft_ms=$upstream_http_x_ttft_ms

Retries log lists (``"127.0.0.1:80, 127.0.0.2:80"`` with matching time and status lists; `` : ``
between upstream groups): the *last* upstream answered the client, so the record describes it (its
own response time and status). ``total_ms`` is that upstream's ``$upstream_response_time`` (the
node's time, without gateway queueing), else ``$request_time``. ``ts`` is ``$time_local`` (nginx logs
at request end). Without token counts the record is latency-only; without ``$upstream_addr`` its
node is the source's ``*`` entry of the node map (an nginx in front of one node), else the line is
refused (``no_upstream``); without any time it is refused (``no_latency``), naming what to append.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Any

from outlier_admin.ingest.logformats import NodeMap, ParseError, default_node, map_node

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
        raise ParseError("bad_format", "line does not match the ingress-nginx upstream log format", fmt="nginx")
    fields: dict[str, Any] = m.groupdict()
    for key in ("upstream_addr", "upstream_response_length", "upstream_response_time", "upstream_status"):
        fields[key] = fields[key].split(", ")
    fields["extra"] = dict(_EXTRA.findall(fields.get("extra") or ""))
    return fields


def _float(value: str, field: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ParseError(f"bad_{field}", f"{field} {value!r} is not a number", fmt="nginx") from None


_COMBINED = re.compile(
    r'^(?P<remote_addr>\S+) - (?P<remote_user>\S+) \[(?P<time_local>[^\]]+)\] "(?P<request>[^"]*)" '
    r'(?P<status>\d{3}) (?P<body_bytes_sent>\S+) "(?P<referer>[^"]*)" "(?P<user_agent>[^"]*)"'
    r"(?P<tail>(?: .*)?)$"
)
_KEYS = {"rt": "request_time", "request_time": "request_time", "urt": "upstream_response_time",
         "upstream_response_time": "upstream_response_time", "ua": "upstream_addr", "upstream_addr": "upstream_addr"}
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def _is_address(token: str) -> bool:
    return any(valid_upstream(part) for part in token.split(","))


def _is_times(token: str) -> bool:
    return all(_NUMBER.match(part) or part == "-" for part in token.split(",")) and token != "-"


def combined_fields(line: str) -> dict[str, Any] | None:
    """The fields of a ``combined`` line with its optional suffix (see module docstring), or None.
    Lists (retries, upstream groups) are Python lists; ``extra`` holds the ``key=value`` fields."""
    m = _COMBINED.match(line.rstrip("\r\n"))
    if m is None:
        return None
    fields: dict[str, Any] = {k: v for k, v in m.groupdict().items() if k != "tail"}
    # Lists are written "a, b" (retries) and "a : b" (upstream groups): one token each.
    tail = re.sub(r"\s*(?:,| : )\s*", ",", m["tail"]).split()
    extra: dict[str, str] = {}
    positional: list[str] = []
    for token in tail:
        key, sep, value = token.partition("=")
        if sep and key.isidentifier():
            extra[key] = value.strip('"')
        else:
            positional.append(token)
    named = {"request_time": None, "upstream_addr": None, "upstream_response_time": None}
    addr_at = next((i for i, t in enumerate(positional) if _is_address(t)), None)
    if addr_at is not None:
        named["upstream_addr"] = positional[addr_at]
        before = [t for t in positional[:addr_at] if _is_times(t)]
        after = [t for t in positional[addr_at + 1:] if _is_times(t) or t == "-"]
        named["request_time"] = before[0] if before else None
        named["upstream_response_time"] = after[0] if after else None
    elif len(positional) == 3:
        named.update(zip(named, positional, strict=True))
    elif len(positional) == 2:
        named["request_time"], named["upstream_response_time"] = positional
    elif len(positional) == 1:
        named["request_time"] = positional[0]
    for key, value in extra.items():
        if key in _KEYS:
            named[_KEYS[key]] = value.replace(", ", ",")
    for key, value in named.items():
        fields[key] = None if value in (None, "-") else value.split(",")
    fields["extra"] = extra
    return fields


def _timestamp(time_local: str) -> float:
    try:
        return datetime.strptime(time_local, "%d/%b/%Y:%H:%M:%S %z").timestamp()
    except ValueError:
        raise ParseError("bad_time_local", f"time_local {time_local!r}", fmt="nginx") from None


def _tokens(extra: dict[str, str]) -> dict[str, Any]:
    def count(key: str) -> float | None:
        value = extra.get(key)
        return None if value in (None, "", "-") else _float(value, key)

    ttft = extra.get("ttft_ms")
    return {"prompt_tokens": count("prompt_tokens"), "completion_tokens": count("completion_tokens"),
            "cached_tokens": count("cached_tokens"),
            "ttft_ms": None if ttft in (None, "", "-") else _float(ttft, "ttft_ms")}


def _upstream(addrs: list[str] | None, node_map: NodeMap | None, what: str) -> str:
    upstream = addrs[-1] if addrs else "-"
    if upstream == "-":
        fallback = default_node(node_map)
        if fallback is None:
            raise ParseError("no_upstream", f"{what}: no $upstream_addr, so no node (append $upstream_addr to "
                             "the log_format, or give the source a node for such lines: --node-map '*=ADDR')",
                             fmt="nginx")
        return fallback
    if not valid_upstream(upstream):
        raise ParseError("bad_upstream_addr", f"{upstream!r} is not host:port, [ipv6]:port or unix:path", fmt="nginx")
    return map_node(upstream, node_map)


def _parse_combined(line: str, node_map: NodeMap | None) -> dict[str, Any]:
    f = combined_fields(line)
    if f is None:
        raise ParseError("bad_format", "line matches neither nginx combined nor the ingress-nginx format",
                         fmt="nginx")
    node = _upstream(f["upstream_addr"], node_map, "nginx combined")
    times = f["upstream_response_time"]
    total = times[-1] if times and (f["upstream_addr"] is None or len(times) == len(f["upstream_addr"])) else None
    if total in (None, "-"):
        total = f["request_time"][-1] if f["request_time"] else None
    if total in (None, "-"):
        raise ParseError("no_latency", "nginx combined: no $request_time nor $upstream_response_time in the line "
                         "(append '$request_time $upstream_addr $upstream_response_time' to the log_format)",
                         fmt="nginx")
    extra = f["extra"]
    request_id = extra.get("request_id") or extra.get("req_id")
    return {
        "ts": _timestamp(f["time_local"]),
        "node": node,
        "group": extra.get("group"),
        **_tokens(extra),
        "total_ms": _float(total, "request_time") * 1000.0,
        "status": int(f["status"]),
        "request_id": request_id if request_id not in (None, "", "-") else None,
    }


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One access-log line (ingress-nginx, else combined) -> ingest record (see module docstring)."""
    if _LINE.match(line.rstrip("\r\n")) is None:
        return _parse_combined(line, node_map)
    f = parse_fields(line)
    upstream = _upstream(f["upstream_addr"], node_map, "ingress-nginx")
    extra = f["extra"]
    times = f["upstream_response_time"]
    last_time = times[-1] if len(times) == len(f["upstream_addr"]) else "-"
    total_s = _float(last_time if last_time != "-" else f["request_time"], "request_time")
    statuses = f["upstream_status"]
    last_status = statuses[-1] if len(statuses) == len(f["upstream_addr"]) else "-"
    status = int(last_status) if last_status.isdigit() else int(f["status"])
    return {
        "ts": _timestamp(f["time_local"]),
        "node": upstream,
        "group": extra.get("group"),
        **_tokens(extra),
        "total_ms": total_s * 1000.0,
        "status": status,
        "request_id": f["req_id"] if f["req_id"] != "-" else None,
    }
