"""The log parsers without orjson (the shipper on a gateway host installed from outlier-admin-agent,
redis-py only): ``jsondecode.loads_stdlib`` takes and refuses what ``orjson.loads`` does, and every
recorded gateway log line parses (or is refused, with the same reason and format) the same way."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.logformats import FORMATS, ParseError, jsondecode
from tests.conftest import FIXTURES

LOGS = FIXTURES / "gateway-logs"

# Valid JSON orjson refuses, JSON neither takes, and values both read differently from Python's
# defaults (integers beyond 64 bits).
EDGE_CASES = [
    "1e400", "-1e400", '{"a":1e400}', "1.7976931348623157e309", "1E400", "[1e309]", "1" * 400, "-" + "1" * 400,
    "1" * 5000, "1" * 400 + ".0", "0." + "1" * 5000, "4.9e-324", "1e-400", "1.0e+2", "-0", "-0.0", "1" * 25,
    "18446744073709551615", "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
    "-18446744073709551615", "12345678901234567890.0e-5",
    "NaN", "Infinity", "-Infinity", '{"a":NaN}',
    '"\\ud800"', '"\\udc00"', '{"k\\ud800":1}', '{"a":[1,{"b":"\\udfff"}]}', '"\\ud800\\udc00"', '"\\uD83D\\uDE00"',
    '"\\\\ud800"', '"a\ud800"', b'"\xed\xa0\x80"', b"\xff", b'{"a":1}', '"\\u0000"', '"\x01"', '{"a":"\u2028"}',
    "\ufeff{}", " {} ", "\t{}\r\n", "\x0b{}", "\xa0{}", "", "\x00", '{"a":1}x', "[1, 2,]", "01", "1_000", "1.",
    ".5", "-", "2e", '{"a":1,"a":2}', "[" * 400 + "]" * 400, "[" * 1025 + "]" * 1025, "[" * 5000 + "]" * 5000,
    "true", "null", '"x"', 5, None,
]


def _outcome(loads, data) -> tuple:
    try:
        value = loads(data)
    except json.JSONDecodeError:  # orjson's is a subclass
        return ("refused",)
    return ("ok", value, _types(value))


def _types(value) -> object:
    """The value's shape with every leaf's type: 1 and 1.0 compare equal, orjson and json must agree."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_the_control_plane_uses_orjson() -> None:
    assert jsondecode.BACKEND == "orjson" and jsondecode.loads is orjson.loads


@pytest.mark.parametrize("data", EDGE_CASES, ids=lambda d: repr(d)[:30])
def test_the_stdlib_decoder_accepts_and_refuses_what_orjson_does(data) -> None:
    assert _outcome(jsondecode.loads_stdlib, data) == _outcome(orjson.loads, data)


# Text with lone surrogates too (st.characters never draws them).
any_text = st.lists(st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=8).map("".join)
# The edges orjson treats its own way, drawn often: NaN and infinities, 64-bit limits, huge integers.
edges = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 2**63 - 1, 2**63, 2**64 - 1, 2**64,
                         -(2**63), -(2**63) - 1, 10**30, 10**400, -(10**400)])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | edges | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(value=json_values, ensure_ascii=st.booleans())
def test_the_stdlib_decoder_matches_orjson_on_generated_documents(value, ensure_ascii) -> None:
    # json.dumps writes NaN, Infinity, integers beyond 64 bits and lone surrogates (as escapes, or
    # raw in the str): all of what orjson refuses or reads differently.
    text = json.dumps(value, ensure_ascii=ensure_ascii)
    assert _outcome(jsondecode.loads_stdlib, text) == _outcome(orjson.loads, text)


def _parse_all() -> list[tuple]:
    out = []
    for path in sorted(LOGS.iterdir()):
        if path.suffix not in (".log", ".jsonl", ".json", ".txt"):
            continue
        lines = [path.read_text()] if path.suffix == ".json" else path.read_text().splitlines()
        for line in filter(str.strip, lines):
            for fmt in sorted(FORMATS):
                try:
                    out.append((path.name, fmt, "ok", FORMATS[fmt](line, node_map={"*": "127.0.0.9:8000"})))
                except ParseError as exc:
                    out.append((path.name, fmt, "refused", exc.reason, exc.fmt))
    return out


def test_every_recorded_gateway_line_parses_the_same_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    with_orjson = _parse_all()
    monkeypatch.setattr(jsondecode, "loads", jsondecode.loads_stdlib)
    without = _parse_all()
    assert without == with_orjson
    assert sum(r[2] == "ok" for r in without) > 30  # the corpus really parses, in several formats


def test_without_orjson_installed_the_parsers_fall_back_to_the_standard_library() -> None:
    """A process where ``import orjson`` fails, as on a gateway host."""
    code = (
        "import sys; sys.modules['orjson'] = None\n"
        "from contract.logformats import FORMATS, ParseError, jsondecode\n"
        "assert jsondecode.BACKEND == 'json' and jsondecode.loads is jsondecode.loads_stdlib\n"
        "rec = FORMATS['jsonl']('{\"ts\": 1.5, \"node\": \"127.0.0.1:8000\", \"total_ms\": 12}')\n"
        "assert rec['total_ms'] == 12\n"
        "for bad in ('{broken', '{\"ts\": 1, \"node\": \"n\", \"total_ms\": 1e400}'):\n"
        "    try:\n"
        "        FORMATS['auto'](bad)\n"
        "    except ParseError as exc:\n"
        "        assert exc.reason == 'bad_json', exc.reason\n"
        "    else:\n"
        "        raise AssertionError(bad)\n"
        "assert 'orjson' not in {m for m in sys.modules if sys.modules[m] is not None}\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
