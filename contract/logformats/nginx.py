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
**Which fields decide what** (the client writes ``$remote_user``, the request, the referer and the
user agent): nginx writes a ``"`` inside any variable as ``\\x22`` (``escape=default``; ``escape=json``
and Apache write ``\\"``), so the first six unescaped quotes of a line are the borders of
``"$request"``, ``"$http_referer"`` and ``"$http_user_agent"`` whatever a client sends, and the
node and the times come from the fields after them, which nginx writes. A line is split at its
quotes, not searched with patterns that a client's text could satisfy, and it is refused
(``field_count``) when its quotes do not fall where the format puts them: a quote written raw
(``escape=none``, or another program writing "combined") would let a client end the user agent
early and write fields of its own. After the user agent, a quote may only enclose a value
(``urt="0.070"``); a key given twice (``duplicate_key``), a field given both by name and by
position, or two upstream addresses by position (``ambiguous_fields``) are refused, so text a
client managed to smuggle into the suffix cannot outvote nginx's own fields. ``escape=none`` is
not supported: with it a client can still add a ``ua=`` field to a log that logs no upstream.
``$remote_user`` is read as nginx writes it, raw (a Basic-auth user name may hold spaces), and is
never used. Every step is linear in the line (at most :data:`MAX_LINE_BYTES`).
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Any

from contract.logformats import NodeMap, ParseError, check_length, default_node, map_node

NAME = "nginx"
# After the user agent, ingress-nginx's fields (the upstream lists: "a, b" on retries). Read from
# the tail only, never across the client's fields; every repeat is of a class its separator is not
# in, so a failing match backtracks a constant amount per character.
_LIST = r"[^\s,]+(?:, [^\s,]+)*"
_INGRESS_TAIL = re.compile(
    r"^ (?P<request_length>\S+) (?P<request_time>\S+) \[(?P<upstream_name>[^\]]*)\] "
    r"\[(?P<alt_upstream_name>[^\]]*)\] "
    rf"(?P<upstream_addr>{_LIST}) (?P<upstream_response_length>{_LIST}) "
    rf"(?P<upstream_response_time>{_LIST}) (?P<upstream_status>{_LIST}) (?P<req_id>\S+)"
    r"(?: (?P<extra>.*))?$"
)
_STATUS_BYTES = re.compile(r"^ (?P<status>\d{3}) (?P<body_bytes_sent>\S+) $")
_TIME_LOCAL = re.compile(r"\[(?P<time_local>[^\[\]]{1,64})\] $")
_KEY_VALUE = re.compile(r'^[A-Za-z_]\w*="[^"]*"$')


def valid_upstream(address: str) -> bool:
    """``host:port`` / ``[v6]:port`` with a port in 1..65535, or a ``unix:`` socket path."""
    if address.startswith("unix:"):
        return len(address) > 5
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or len(port) > 5 or not 0 < int(port) <= 65535 or not host:
        return False
    if host.startswith("["):
        if not host.endswith("]"):
            return False
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
    return True


def split_quoted(line: str) -> list[str]:
    """``line`` cut at its unescaped quotes: outside, inside, outside, ... A quote after an odd run
    of backslashes is escaped (``\\"``: ``escape=json``, Apache). Linear: each piece is read once."""
    pieces = line.split('"')
    if "\\" not in line:
        return pieces
    out: list[str] = []
    field = [pieces[0]]
    for piece in pieces[1:]:
        last = field[-1]
        if (len(last) - len(last.rstrip("\\"))) % 2:
            field.append(piece)  # an escaped quote: the same field goes on
        else:
            out.append('"'.join(field))
            field = [piece]
    out.append('"'.join(field))
    return out


def _field_count(detail: str) -> ParseError:
    return ParseError("field_count", detail + ": a quote written unescaped inside $request, $http_referer or "
                      "$http_user_agent (log_format ... escape=none, or a program other than nginx) lets a "
                      "client write fields of its own, so the line is not read", fmt=NAME)


def _head(prefix: str) -> dict[str, str] | None:
    """``$remote_addr - $remote_user [$time_local] `` (the text before the first quote), or None.
    The time is the last bracket (it holds none); the user is what lies between, spaces and all."""
    bracket = prefix.rfind("[")
    m = _TIME_LOCAL.match(prefix, bracket) if bracket > 0 else None
    if m is None:
        return None
    addr, sep, user = prefix[:bracket].partition(" - ")
    if not sep or not addr or " " in addr or not user.endswith(" ") or len(user) < 2:
        return None
    return {"remote_addr": addr, "remote_user": user[:-1], "time_local": m["time_local"]}


_SNIFF_TIME = re.compile(r"^\d{2}/[A-Za-z]{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}$")


def looks_like(text: str) -> bool:
    """Whether ``text`` starts like an nginx access-log line (``addr - user [dd/Mon/yyyy:...] "``)."""
    quote = text.find('"')
    head = _head(text[:quote]) if quote > 0 else None
    return head is not None and _SNIFF_TIME.match(head["time_local"]) is not None


def _split(line: str) -> tuple[dict[str, Any], str] | None:
    """The combined fields and the text after the user agent; None when the line does not start like
    nginx's; ``field_count`` when it does but its quotes are not where the format puts them."""
    check_length(line)
    line = line.rstrip("\r\n")
    quote = line.find('"')
    head = _head(line[:quote]) if quote > 0 else None
    if head is None:
        return None
    parts = split_quoted(line)
    if len(parts) < 7 or len(parts) % 2 == 0:
        raise _field_count(f"{len(parts) - 1} quotes where the format writes 6, then pairs")
    middle = _STATUS_BYTES.match(parts[2])
    if middle is None or parts[4] != " ":
        raise _field_count("the quoted fields are not where the combined format puts them")
    tail = '"'.join(parts[6:])
    if tail and tail[0] != " ":
        raise _field_count("text right after the user agent's closing quote")
    return {**head, "request": parts[1], **middle.groupdict(), "referer": parts[3], "user_agent": parts[5]}, tail


# nginx writes a handful of fields after the user agent (ingress-nginx: 9, plus the key=value ones
# an operator appends); more is not a line of this format, and stopping there bounds the work per
# field (a line of the cap made of one-character fields would otherwise cost a Python step each).
MAX_TAIL_FIELDS = 64


def _tail_tokens(tail: str) -> list[str]:
    """The whitespace-separated fields of ``tail``, a list written ``a, b`` (retries) or ``a : b``
    (upstream groups) joined into one ``a,b``; at most :data:`MAX_TAIL_FIELDS` (``field_count``
    beyond). Linear: one split, one pass (a regular expression such as ``\\s*(?:,| : )\\s*``
    backtracks quadratically on a run of spaces, which a client controls)."""
    words = tail.split(None, MAX_TAIL_FIELDS)
    if len(words) > MAX_TAIL_FIELDS:
        raise ParseError("field_count", f"over {MAX_TAIL_FIELDS} fields after the user agent", fmt=NAME)
    out: list[str] = []
    join = False
    for word in words:
        if word in (",", ":"):
            join = bool(out)
            continue
        if out and (join or out[-1].endswith(",") or word.startswith(",")):
            out[-1] = out[-1].rstrip(",") + "," + word.lstrip(",")
        else:
            out.append(word)
        join = False
    return out


def _extra(tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    """``key=value`` fields (quotes around a value dropped) and the positional rest. A quote may
    only enclose a value; a key may appear once."""
    extra: dict[str, str] = {}
    positional: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        if '"' in token and (not sep or _KEY_VALUE.match(token) is None):
            raise _field_count(f"a quote in {token[:40]!r} after the user agent, where only key=\"value\" has one")
        if sep and key.isidentifier():
            if key in extra:
                raise ParseError("duplicate_key", f"{key}= appears twice after the user agent", fmt=NAME)
            extra[key] = value.strip('"')
        else:
            positional.append(token)
    return extra, positional


def parse_fields(line: str) -> dict[str, Any]:
    """The raw fields of one ingress-nginx line (strings; upstream lists split into Python lists)."""
    split = _split(line)
    m = _INGRESS_TAIL.match(split[1]) if split is not None else None
    if split is None or m is None:
        raise ParseError("bad_format", "line does not match the ingress-nginx upstream log format", fmt=NAME)
    return _ingress_fields(split[0], m)


def _ingress_fields(head: dict[str, Any], m: re.Match[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {**head, **m.groupdict()}
    for key in ("upstream_addr", "upstream_response_length", "upstream_response_time", "upstream_status"):
        fields[key] = fields[key].split(", ")
    extra, _ = _extra(_tail_tokens(fields.get("extra") or ""))
    fields["extra"] = extra
    return fields


def _float(value: str, field: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ParseError(f"bad_{field}", f"{field} {value[:40]!r} is not a number", fmt=NAME) from None


_KEYS = {"rt": "request_time", "request_time": "request_time", "urt": "upstream_response_time",
         "upstream_response_time": "upstream_response_time", "ua": "upstream_addr", "upstream_addr": "upstream_addr"}
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def _parts(token: str) -> list[str]:
    """A list field's items; none past :data:`MAX_TAIL_FIELDS` (more retries than fields is not a list
    nginx wrote, and a token of the cap's length in commas would cost a Python step per item)."""
    return token.split(",") if token.count(",") < MAX_TAIL_FIELDS else []


def _is_address(token: str) -> bool:
    return any(valid_upstream(part) for part in _parts(token))


def _is_times(token: str) -> bool:
    parts = _parts(token)
    return bool(parts) and all(_NUMBER.match(part) or part == "-" for part in parts) and token != "-"


def _combined(split: tuple[dict[str, Any], str] | None) -> dict[str, Any] | None:
    if split is None:
        return None
    fields, tail = split
    extra, positional = _extra(_tail_tokens(tail))
    named: dict[str, str | None] = {"request_time": None, "upstream_addr": None, "upstream_response_time": None}
    addrs = [i for i, t in enumerate(positional) if _is_address(t)]
    if len(addrs) > 1:
        raise ParseError("ambiguous_fields", f"{len(addrs)} upstream addresses after the user agent, where the "
                         "format writes one", fmt=NAME)
    if addrs:
        addr_at = addrs[0]
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
            if named[_KEYS[key]] not in (None, "-"):
                raise ParseError("ambiguous_fields", f"{_KEYS[key]} given both by position and as {key}=",
                                 fmt=NAME)
            named[_KEYS[key]] = value
    for key, value in named.items():
        fields[key] = None if value in (None, "-") else value.split(",")
    fields["extra"] = extra
    return fields


def _timestamp(time_local: str) -> float:
    try:
        return datetime.strptime(time_local, "%d/%b/%Y:%H:%M:%S %z").timestamp()
    except ValueError:
        raise ParseError("bad_time_local", f"time_local {time_local!r}", fmt=NAME) from None


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
                             fmt=NAME)
        return fallback
    if not valid_upstream(upstream):
        raise ParseError("bad_upstream_addr", f"{upstream!r} is not host:port, [ipv6]:port or unix:path", fmt=NAME)
    return map_node(upstream, node_map)


def _parse_combined(split: tuple[dict[str, Any], str] | None, node_map: NodeMap | None) -> dict[str, Any]:
    f = _combined(split)
    if f is None:
        raise ParseError("bad_format", "line matches neither nginx combined nor the ingress-nginx format",
                         fmt=NAME)
    node = _upstream(f["upstream_addr"], node_map, "nginx combined")
    times = f["upstream_response_time"]
    total = times[-1] if times and (f["upstream_addr"] is None or len(times) == len(f["upstream_addr"])) else None
    if total in (None, "-"):
        total = f["request_time"][-1] if f["request_time"] else None
    if total in (None, "-"):
        raise ParseError("no_latency", "nginx combined: no $request_time nor $upstream_response_time in the line "
                         "(append '$request_time $upstream_addr $upstream_response_time' to the log_format)",
                         fmt=NAME)
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
    split = _split(line)
    m = _INGRESS_TAIL.match(split[1]) if split is not None else None
    if split is None or m is None:
        return _parse_combined(split, node_map)
    f = _ingress_fields(split[0], m)
    upstream = _upstream(f["upstream_addr"], node_map, "ingress-nginx")
    extra = f["extra"]
    times = f["upstream_response_time"]
    last_time = times[-1] if len(times) == len(f["upstream_addr"]) else "-"
    total_s = _float(last_time if last_time != "-" else f["request_time"], "request_time")
    statuses = f["upstream_status"]
    last_status = statuses[-1] if len(statuses) == len(f["upstream_addr"]) else "-"
    status = int(last_status) if last_status.isdigit() and len(last_status) == 3 else int(f["status"])
    return {
        "ts": _timestamp(f["time_local"]),
        "node": upstream,
        "group": extra.get("group"),
        **_tokens(extra),
        "total_ms": total_s * 1000.0,
        "status": status,
        "request_id": f["req_id"] if f["req_id"] != "-" else None,
    }
