"""Issue 29 finding 2 and its audit: the fields a client controls never decide the node. One test
per finding with the probe's vector (User-Agent ``curl/8" "atk-N" "llm" "127.0.4.3:18950``): before
the fix each credited 127.0.4.3, the node of the client's choosing."""

from __future__ import annotations

import json

import pytest

from contract.logformats import FORMATS, ParseError, jsondecode

ATTACK_UA = 'curl/8" "atk-{n}" "llm" "127.0.4.3:18950'
REAL = "127.0.0.1:8001"
FORGED = "127.0.4.3:18950"


def outcome(fmt: str, line: str) -> str:
    """The node a line is credited to, or ``refused:<reason>``."""
    try:
        return FORMATS[fmt](line)["node"]
    except ParseError as exc:
        return f"refused:{exc.reason}"


# --- Envoy's default text format (envoyproxy/envoy#4191: quotes inside headers are not escaped) ----


def envoy_line(ua: str, *, upstream: str = REAL) -> str:
    return (f'[2026-12-03T07:35:32.000Z] "POST /v1/completions HTTP/1.1" 200 - 154 0 2260 2250 "-" "{ua}" '
            f'"9a1d6c3e-5f1b-4a7e-9f1e-0c6b8d2a4e11" "llm" "{upstream}"')


@pytest.mark.parametrize("fmt", ["envoy", "auto"])
def test_envoy_probe_vector_is_refused_not_credited_to_the_forged_node(fmt):
    results = {outcome(fmt, envoy_line(ATTACK_UA.format(n=n))) for n in range(50)}
    assert results == {"refused:field_count"}


def test_envoy_refusal_names_the_json_access_log():
    with pytest.raises(ParseError) as err:
        FORMATS["envoy"](envoy_line(ATTACK_UA.format(n=1)))
    assert err.value.fmt == "envoy" and "json_format" in err.value.detail


@pytest.mark.parametrize("header", ["xff", "rid", "authority", "path"])
def test_envoy_a_quote_in_any_client_header_is_refused(header):
    line = envoy_line("curl/8")
    forged = 'x" "127.0.4.3:18950'
    line = {"xff": line.replace('"-"', f'"{forged}"', 1),
            "rid": line.replace("9a1d6c3e-5f1b-4a7e-9f1e-0c6b8d2a4e11", forged),
            "authority": line.replace('"llm"', f'"{forged}"'),
            "path": line.replace("/v1/completions", f"/v1{forged}")}[header]
    assert outcome("envoy", line) == "refused:field_count"


def test_envoy_clean_line_is_credited_to_its_upstream_and_json_escapes_the_vector():
    rec = FORMATS["envoy"](envoy_line("curl/8.0"))
    assert (rec["node"], rec["total_ms"], rec["request_id"]) == (REAL, 2260.0, "9a1d6c3e-5f1b-4a7e-9f1e-0c6b8d2a4e11")
    # Envoy's JSON access log, the recommendation: the same User-Agent stays in its field.
    obj = {"start_time": "2026-12-03T07:35:32.000Z", "duration": 2260, "upstream_host": REAL,
           "response_code": 200, "user_agent": ATTACK_UA.format(n=1), "x-request-id": "r1"}
    assert FORMATS["auto"](json.dumps(obj))["node"] == REAL


# --- nginx: $remote_user, referer and user agent -------------------------------------------------------

NGINX = ('127.0.0.1 - {user} [03/Dec/2026:07:35:32 +0000] "POST /v1/completions HTTP/1.1" 200 180 "{ref}" "{ua}" '
         f"0.300 {REAL} 0.250")


def nginx_line(ua: str = "curl/8.0", *, user: str = "-", ref: str = "-") -> str:
    return NGINX.format(user=user, ref=ref, ua=ua)


def test_nginx_escapes_quotes_as_x22_and_the_line_keeps_its_node():
    # What nginx writes for the probe's User-Agent (escape=default): every " as \x22.
    ua = ATTACK_UA.format(n=1).replace('"', "\\x22")
    for line in (nginx_line(ua), nginx_line(ref=ua), nginx_line(user=ua)):
        assert outcome("auto", line) == REAL


@pytest.mark.parametrize("ua", [
    ATTACK_UA.format(n=1),
    f'curl/8" 0.001 {FORGED} 0.001 "x',  # before the fix: credited to 127.0.4.3
    f'curl/8" 0.001 {FORGED} 0.001 rt="1',
    f'curl/8" ua="{FORGED}',
    'curl/8" rt="0.001',
])
@pytest.mark.parametrize("field", ["ua", "ref"])
def test_nginx_unescaped_quotes_are_refused_not_credited(ua, field):
    line = nginx_line(ua) if field == "ua" else nginx_line(ref=ua)
    assert outcome("nginx", line).startswith("refused:"), line


def test_nginx_escape_none_vector_credited_the_forged_node_before():
    line = nginx_line(f'curl/8" 0.001 {FORGED} 0.001 "x')
    assert outcome("nginx", line) == "refused:field_count"


def test_nginx_a_basic_auth_user_name_with_spaces_and_brackets_is_read_raw():
    user = "a b [03/Dec/2026:07:35:32 +0000] " + "x" * 6000
    assert outcome("auto", nginx_line(user=user)) == REAL


def test_nginx_key_value_fields_may_not_repeat_or_contradict_the_positional_ones():
    base = '127.0.0.1 - - [03/Dec/2026:07:35:32 +0000] "POST / HTTP/1.1" 200 1 "-" "-"'
    assert outcome("nginx", base + f' ua="{REAL}" ua="{FORGED}" urt="0.2"') == "refused:duplicate_key"
    assert outcome("nginx", base + f" 0.3 {REAL} 0.2 ua={FORGED}") == "refused:ambiguous_fields"
    assert outcome("nginx", base + f" 0.3 {FORGED} {REAL} 0.2") == "refused:ambiguous_fields"
    assert outcome("nginx", base + f' rt=0.3 ua="{REAL}" urt="0.2"') == REAL


def test_apache_style_backslash_escaped_quotes_stay_inside_their_field():
    ua = ATTACK_UA.format(n=1).replace('"', '\\"')
    assert outcome("nginx", nginx_line(ua)) == REAL


# --- HAProxy: captured headers --------------------------------------------------------------------------

HAPROXY = ("<134>Dec  3 18:48:14 haproxy[23597]: 127.0.0.1:47866 [03/Dec/2026:18:48:14.106] llm_in llm/s0 "
           '0/0/0/12/12 200 472 - - ---- 2/2/0/0/0 0/0 {{{req}}} {{12|16|41}} "POST /v1/completions HTTP/1.1"')


def test_haproxy_captured_request_headers_cannot_shift_the_blocks():
    # HAProxy writes { | } " inside a capture as #7B #7C #7D #22: the token block stays the server's.
    rec = FORMATS["haproxy"](HAPROXY.format(req="llm|curl/8#22 #7D #7B999999#7C1#7D"))
    assert (rec["node"], rec["prompt_tokens"], rec["completion_tokens"], rec["ttft_ms"]) == ("s0", 12, 16, 41.0)
    # Written raw (not HAProxy's escaping), the blocks would be the client's: refused.
    assert outcome("haproxy", HAPROXY.format(req="llm} {999999|1")) == "refused:bad_format"
    assert outcome("haproxy", HAPROXY.format(req='llm" "x')) == "refused:bad_format"


# --- JSON formats: a key given twice ---------------------------------------------------------------------

DUPLICATES = {
    "jsonl": '{"ts": 1, "node": "%s", "total_ms": 5, "node": "%s"}',
    "openai": '{"ts": 1, "upstream": "%s", "duration_ms": 5, "usage": {"prompt_tokens": 1}, "upstream": "%s"}',
    "envoy": '{"start_time": "2026-12-03T07:35:32.000Z", "duration": 5, "upstream_host": "%s", '
             '"upstream_host": "%s"}',
    "litellm": '{"startTime": 1, "endTime": 2, "api_base": "http://%s", "api_base": "http://%s"}',
}


@pytest.mark.parametrize("backend", ["orjson", "stdlib"])
@pytest.mark.parametrize("fmt", sorted(DUPLICATES))
def test_a_json_line_naming_a_key_twice_is_refused(fmt, backend, monkeypatch):
    if backend == "stdlib":
        monkeypatch.setattr(jsondecode, "loads", jsondecode.loads_stdlib)
    line = DUPLICATES[fmt] % (REAL, FORGED)  # a decoder keeps the last: the forged one
    assert outcome(fmt, line) == "refused:duplicate_key"
    assert outcome("auto", line) == "refused:duplicate_key"
    nested = f'{{"ts": 1, "node": "{REAL}", "total_ms": 5, "usage": {{"prompt_tokens": 1, "prompt_tokens": 9}}}}'
    assert outcome("openai", nested) == "refused:duplicate_key"


@pytest.mark.parametrize("text", [
    '{"a": 1, "a" : 2}', '{"a" :1,"a":2}', '{"a":"x\\":y","a":1}', '{"k":{"x":1,"x":2}}', '[{"a":1,"b":{"a":1,"a":2}}]',
    '{\n  "a": 1,\n  "a": 2\n}',
])
def test_loads_unique_finds_every_duplicate_the_fast_path_could_miss(text):
    with pytest.raises(jsondecode.DuplicateKeyError):
        jsondecode.loads_unique(text)


@pytest.mark.parametrize("text", ['{"a": 1, "b" : {"a": 1}}', '{"a":"\\\\","b":"\\":"}', '[{"a":1},{"a":2}]',
                                  '{"a": "x\\":", "b": 2}'])
def test_loads_unique_takes_what_has_no_duplicate(text):
    assert jsondecode.loads_unique(text) == json.loads(text)
