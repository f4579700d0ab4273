"""LiteLLM's ``StandardLoggingPayload`` (its proxy's ``standard_logging_object``; LiteLLM docs,
"StandardLoggingPayload Specification"), one JSON object per line, bare or wrapped as
``{"standard_logging_object": {...}}``.

Mapping onto an ingest record:

- ``node``: the deployment that served the request, ``api_base`` (else ``hidden_params.api_base``) as
  ``host:port`` (the scheme's port when the URL names none), else ``model_id``;
- ``group``: ``model_group`` (LiteLLM's name for a set of deployments serving one model: the
  peers a node is compared with), when not empty;
- ``ts`` = ``endTime``; ``total_ms`` = ``endTime - startTime``. LiteLLM writes epoch seconds in the
  Python object and ``"YYYY-MM-DD HH:MM:SS.ffffff"`` (no zone) when it serialises the payload
  (its GCS Pub/Sub and file loggers); a time without a zone is read as UTC: run LiteLLM in UTC;
- ``ttft_ms`` = ``completionStartTime - startTime`` for a streamed request (``stream`` true) only:
  for a non-streamed one LiteLLM sets ``completionStartTime`` to the end;
- tokens: ``prompt_tokens`` / ``completion_tokens``; ``cached_tokens`` from
  ``response.usage.prompt_tokens_details.cached_tokens``. A failed call logs 0 and 0 tokens: it is
  kept latency-only (the error is evidence, its sizes are not);
- ``status``: ``success`` -> 200; ``failure`` -> ``error_information.error_code`` when it is an HTTP
  status, 504 when ``error_class`` names a timeout (a timeout is a latency sample too), else 500;
- ``request_id``: ``id``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from contract.logformats import NodeMap, ParseError, load_object, map_node
from contract.logformats.openai import address_of, dig, first, number

NAME = "litellm"


def is_payload(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is (or wraps) a StandardLoggingPayload."""
    if isinstance(obj.get("standard_logging_object"), dict):
        return True
    return "startTime" in obj and "endTime" in obj


def _time(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ParseError(f"bad_{key}", f"{key} {value[:40]!r} is neither epoch seconds nor a date",
                             fmt=NAME) from None
        return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    raise ParseError(f"missing_{key}", f"no {key} in the payload", fmt=NAME)


def _status(obj: dict[str, Any]) -> int:
    if obj.get("status", "success") == "success":
        return 200
    code = str(dig(obj, "error_information.error_code") or "").strip()
    if code.isdigit() and 100 <= int(code) <= 599:
        return int(code)
    if "timeout" in str(dig(obj, "error_information.error_class") or "").lower():
        return 504
    return 500


def parse_object(obj: dict[str, Any], *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One decoded payload -> ingest record (see module docstring)."""
    if isinstance(obj.get("standard_logging_object"), dict):
        obj = obj["standard_logging_object"]
    node = address_of(first(obj, ("api_base", "hidden_params.api_base"))) or first(obj, ("model_id",))
    if not node:
        raise ParseError("no_upstream", "no api_base nor model_id: which deployment served it is unknown", fmt=NAME)
    start, end = _time(obj, "startTime"), _time(obj, "endTime")
    status = _status(obj)
    prompt, completion = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if status >= 400 and not prompt and not completion:
        prompt = completion = None
    ttft = None
    if obj.get("stream") is True and obj.get("completionStartTime") not in (None, ""):
        first_token = _time(obj, "completionStartTime")
        if start <= first_token <= end:
            ttft = (first_token - start) * 1000.0
    group = obj.get("model_group")
    request_id = obj.get("id")
    return {
        "ts": end,
        "node": map_node(str(node), node_map),
        "group": group if isinstance(group, str) and group else None,
        "prompt_tokens": None if prompt is None else number(prompt, "prompt_tokens", NAME),
        "completion_tokens": None if completion is None else number(completion, "completion_tokens", NAME),
        "cached_tokens": dig(obj, "response.usage.prompt_tokens_details.cached_tokens"),
        "ttft_ms": ttft,
        "total_ms": (end - start) * 1000.0,
        "status": status,
        "request_id": request_id if isinstance(request_id, str) and request_id else None,
    }


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One StandardLoggingPayload JSON line -> ingest record."""
    obj = load_object(line, reason="not_an_object", what="a LiteLLM StandardLoggingPayload", fmt=NAME)
    if not is_payload(obj):
        raise ParseError("bad_format", "no startTime/endTime: not a LiteLLM StandardLoggingPayload", fmt=NAME)
    return parse_object(obj, node_map=node_map)
