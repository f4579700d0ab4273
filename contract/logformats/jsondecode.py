"""JSON decoding for the log-format parsers, with or without orjson.

:func:`loads` is ``orjson.loads`` when orjson is installed (the control plane: the fast path) and
:func:`loads_stdlib` otherwise (a gateway host running the shipper from ``outlier-admin-agent``,
whose only dependency is redis-py). Catch :data:`JSONDecodeError` (``json.JSONDecodeError``, of
which orjson's is a subclass). Callers look ``loads`` up on this module at call time
(``jsondecode.loads(...)``), so a test can swap it.

:func:`loads_stdlib` takes and refuses what orjson does, so a line parses the same on both: orjson
refuses valid JSON that the standard library takes, and so does it — ``NaN`` / ``Infinity``, a
number beyond a double (``1e400``, a 400-digit integer), a lone surrogate (``"\\ud800"``), text
that is not UTF-8 — and, like orjson, it reads an integer outside 64 bits as a float. What may
differ is an exception's message (the parsers put it in ``ParseError.detail``, never in the
reason), and how deep nesting is refused: orjson past 1024 levels, the standard library past what
the interpreter's recursion limit leaves (about 990 at the default 1000); both raise
:data:`JSONDecodeError`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

try:
    import orjson
except ImportError:  # the agent distribution: redis-py only
    orjson = None

JSONDecodeError = json.JSONDecodeError
BACKEND = "orjson" if orjson is not None else "json"

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


class _Refused(ValueError):
    """Raised by the decoder's hooks; :func:`loads_stdlib` turns it into JSONDecodeError."""


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused("number is infinity when parsed as double")
    return value


def _int(text: str) -> int | float:
    # orjson: an integer within [-2**63, 2**64 - 1] is an int, any other a float (refused beyond a
    # double). The length test first: int() refuses strings of over 4300 digits.
    if len(text) <= 21:
        value = int(text)
        if _INT64_MIN <= value <= _UINT64_MAX:
            return value
    return _float(text)


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_float=_float, parse_int=_int, parse_constant=_constant)


def _has_lone_surrogate(obj: Any) -> bool:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def loads_stdlib(data: str | bytes | bytearray | memoryview) -> Any:
    """``orjson.loads`` with the standard library (see module docstring)."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise JSONDecodeError("not valid UTF-8", "", 0) from None
    elif isinstance(data, str):
        text = data
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise JSONDecodeError("str is not valid UTF-8: surrogates not allowed", text, 0) from None
    else:
        raise JSONDecodeError("input must be bytes, bytearray, memoryview, or str", "", 0)
    try:
        obj = _DECODER.decode(text)
    except _Refused as exc:
        raise JSONDecodeError(str(exc), text, 0) from None
    except RecursionError:
        raise JSONDecodeError("depth limit exceeded", text, 0) from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(obj):
        raise JSONDecodeError("lone surrogate in string", text, 0)
    return obj


loads = orjson.loads if orjson is not None else loads_stdlib


class DuplicateKeyError(JSONDecodeError):
    """An object names one key twice (:func:`loads_unique`)."""


class _Duplicate(ValueError):
    """Raised by :func:`_unique_pairs` with the repeated key."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return obj


# Reads only the keys' uniqueness, on text :func:`loads` has already taken; numbers as 0, cheaply.
_PAIRS_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_float=lambda _: 0,
                                  parse_int=lambda _: 0, parse_constant=lambda _: 0)
_KEY_WITH_SPACE = re.compile(r'"[ \t\r\n]+:')


def _keys_in(obj: Any) -> int:
    count, stack = 0, [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))
    return count


def loads_unique(data: str | bytes) -> Any:
    """:func:`loads`, refusing an object that names a key twice (:class:`DuplicateKeyError`).

    Why: a decoder keeps the last of two equal keys, so whoever writes into a log line written
    without JSON escaping (nginx ``escape=none``) could add a ``"node"`` of their choosing after the
    real one. Both decoders keep one of the two silently, so the text is checked: in JSON text with
    no ``\\"`` (an escaped quote, or a backslash closing a string) every ``":`` ends a key, so when
    their count equals the decoded objects' keys and no key is spaced from its colon, no key was
    dropped. Any other text (a quote inside a value, pretty-printed JSON) is read once more by the
    standard library's decoder, which sees every pair. Linear in the text either way."""
    obj = loads(data)
    if not isinstance(obj, dict | list):
        return obj
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
    if '\\"' not in text and not _KEY_WITH_SPACE.search(text) and text.count('":') == _keys_in(obj):
        return obj
    try:
        _PAIRS_DECODER.decode(text)
    except _Duplicate as exc:
        raise DuplicateKeyError(f"key {str(exc)[:40]!r} appears twice in one object", text[:100], 0) from None
    except RecursionError:  # nested deeper than the standard library reads (about 990 levels)
        raise JSONDecodeError("nested too deep to check its keys", text[:100], 0) from None
    return obj
