"""Adversarial access-log lines for the parsers' linear-time tests and the probe script
(``tests/reliability/test_parser_probe.py``): every format's line shape with one field, or the
whole line, made of a long run of what the patterns repeat (spaces, quotes, ``:``, ``,``, digits,
``\\S+:`` runs, brackets, backslashes, ``key=``...). A template holds ``{RUN}`` where the run goes
(``{JSON}`` inside a JSON string); :func:`build` fills it to a given length."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

from contract.logformats import ParseError

# What the patterns of the formats repeat: each one a unit of a run.
UNITS = [" ", '"', ":", ",", "1", "a", "a:", "1:", "[", "]", "{", "}", "\\", "=", "a=", ", ", " : ", "\t", "/",
         "-", ".", "#", "|", "x ", '" "', "\\x22", "1/", "{|", "a=b ", '"a" ', "1.1 ", "127.0.0.1:1 "]

_NGINX = '127.0.0.1 - {u} [03/Dec/2026:07:35:32 +0000] "{r}" 200 180 "{ref}" "{ua}"{tail}'
_INGRESS_TAIL = " 89 0.001 [default-web-8080] [] 127.0.0.5:8080 59 0.000 200 529a0079{x}"
_ENVOY = '[2026-12-03T07:35:32.000Z] "{r}" 200 - 1 1 226 100 "{xff}" "{ua}" "{rid}" "{auth}" "127.0.0.3:18950"'
_HAPROXY = ("<134>Dec  3 18:48:14 haproxy[23597]: {pre}127.0.0.1:47866 [03/Dec/2026:18:48:14.106] llm_in llm/s0 "
            '0/0/0/12/12 200 472 - - ---- 2/2/0/0/0 0/0{cap} "{r}"')


def _nginx(**kw: str) -> str:
    fields = {"u": "-", "r": "POST /v1/completions HTTP/1.1", "ref": "-", "ua": "curl/8.0",
              "tail": " 0.300 127.0.0.1:8001 0.250", **kw}
    return _NGINX.format(**fields)


def _envoy(**kw: str) -> str:
    fields = {"r": "POST /v1/completions HTTP/1.1", "xff": "-", "ua": "curl/8.0", "rid": "r1", "auth": "llm", **kw}
    return _ENVOY.format(**fields)


def _haproxy(**kw: str) -> str:
    return _HAPROXY.format(**{"pre": "", "cap": "", "r": "POST /v1/completions HTTP/1.1", **kw})


R = "{RUN}"
_TEXT_TEMPLATES = [R, "a" + R, R + "x", "haproxy[1]: " + R, "[" + R, '"' + R, "{" + R, R + ' "GET / HTTP/1.1"']
TEMPLATES: dict[str, list[str]] = {
    "nginx": [_nginx(u=R), _nginx(r=R), _nginx(ref=R), _nginx(ua=R), _nginx(tail=" " + R),
              _nginx(tail=" 0.300 " + R + " 127.0.0.1:8001 0.250"), _nginx(tail=_INGRESS_TAIL.format(x=" " + R)),
              _nginx(tail=" 89 0.001 [" + R + "] [] 127.0.0.5:8080 59 0.000 200 5"), _nginx(u=R, tail=""),
              "127.0.0.1 - - [" + R, "127.0.0.1 - " + R + ' "', *_TEXT_TEMPLATES],
    "envoy": [_envoy(r=R), _envoy(xff=R), _envoy(ua=R), _envoy(rid=R), _envoy(auth=R),
              "[2026-12-03T07:35:32.000Z] " + R, "[" + R + '] "', *_TEXT_TEMPLATES],
    "haproxy": [_haproxy(pre=R), _haproxy(cap=" {" + R + "}"), _haproxy(cap=" {a} {" + R + "}"), _haproxy(r=R),
                "<134>Dec  3 18:48:14 haproxy[23597]: 127.0.0.1:47866 [03/Dec/2026:18:48:14.106] " + R,
                R + " [03/Dec/2026:18:48:14.106] llm_in llm/s0 0/0/0/12/12 200 472 - - ---- 2/2/0/0/0 0/0 \"GET /\"",
                *_TEXT_TEMPLATES],
}
J = "{JSON}"  # the run JSON-escaped: the line stays JSON and reaches the parser's own fields
_JSON_TEMPLATES = ['{"ts": 1, "node": "127.0.0.1:1", "total_ms": 5, "ua": "' + J + '"}',
                   '{"start_time": "2026-12-03T07:35:32.000Z", "duration": 5, "upstream_host": "127.0.0.1:1", '
                   '"user_agent": "' + J + '"}',
                   '{"startTime": 1, "endTime": 2, "api_base": "http://127.0.0.1:1", "messages": "' + J + '"}',
                   '{"upstream": "127.0.0.1:1", "duration_ms": 5, "usage": {"prompt_tokens": 1}, "x": "' + J + '"}',
                   '{"' + J + '": 1}', "{" + R, '{"a": "' + R]
for _fmt in ("jsonl", "litellm", "openai"):
    TEMPLATES[_fmt] = [*_JSON_TEMPLATES, *_TEXT_TEMPLATES]
TEMPLATES["envoy"] += _JSON_TEMPLATES
TEMPLATES["auto"] = [t for fmt in ("nginx", "envoy", "haproxy") for t in TEMPLATES[fmt]] + _JSON_TEMPLATES


def build(template: str, unit: str, size: int) -> str:
    """``template`` with its ``{RUN}`` (or ``{JSON}``, JSON-escaped) a run of ``unit`` of about
    ``size`` characters."""
    escaped = json.dumps(unit)[1:-1]  # JSON escapes a character at a time: escaped(u * k) == escaped(u) * k
    return template.replace(R, unit * max(1, size // len(unit))).replace(J, escaped * max(1, size // len(escaped)))


def parse_seconds(parse: Callable[..., object], line: str, reps: int = 3) -> float:
    """The least of ``reps`` timings of one parse (parsed or refused): the least is the one a
    scheduler or a collection did not lengthen."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        with contextlib.suppress(ParseError):
            parse(line)
        best = min(best, time.perf_counter() - start)
    return best
