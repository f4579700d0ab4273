"""The one owner of what a group name, node id, address, scrape URL and allow-list entry may be."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.names import (
    GROUP_NAME_RE,
    NameError_,
    group_slug,
    host_allowed,
    parse_address,
    unique_group_slug,
    validate_allow_entry,
    validate_group_name,
    validate_node_id,
    validate_scrape_url,
)

SLUG_RE = re.compile(r"[-a-zA-Z0-9_]+")  # Django's <slug:> converter


@pytest.mark.parametrize(("text", "base", "hostport"), [
    ("127.0.0.1:8000", "http://127.0.0.1:8000", "127.0.0.1:8000"),
    ("https://127.0.0.5:443/", "https://127.0.0.5:443", "127.0.0.5:443"),
    ("[::1]:8000", "http://[::1]:8000", "[::1]:8000"),
    ("vllm-0.pool-a.svc.cluster.local:8000", "http://vllm-0.pool-a.svc.cluster.local:8000",
     "vllm-0.pool-a.svc.cluster.local:8000"),
    ("LOCALHOST:80", "http://localhost:80", "localhost:80"),
    ("[::ffff:127.0.0.1]:80", "http://127.0.0.1:80", "127.0.0.1:80"),
])
def test_valid_addresses(text, base, hostport):
    addr = parse_address(text)
    assert (addr.base_url, addr.hostport) == (base, hostport)


@pytest.mark.parametrize(("text", "reason"), [
    ("http://127.0.0.1:18550/internal/admin?token=x#", "bad_address"),
    ("http://user:pw@127.0.0.1:80", "bad_address"),
    ("127.0.0.1", "bad_address"),            # no port
    ("127.0.0.1:0", "bad_address"),
    ("127.0.0.1:65536", "bad_address"),
    ("ftp://127.0.0.1:21", "bad_address"),
    ("127.0.0.1:80\x00", "bad_address"),
    ("<script>alert(1)</script>:80", "bad_address"),
    ("::1:8000", "bad_address"),             # IPv6 without brackets
    ("999.1.1.1:80", "bad_address"),
    ("169.254.169.254:80", "forbidden_address"),  # cloud metadata
    ("[::ffff:169.254.169.254]:80", "forbidden_address"),
    ("0.0.0.0:80", "forbidden_address"),
    ("224.0.0.1:80", "forbidden_address"),
    ("", "bad_address"),
])
def test_invalid_addresses(text, reason):
    with pytest.raises(NameError_) as err:
        parse_address(text)
    assert err.value.reason == reason


def test_node_ids_and_group_names():
    for ok in ("127.0.0.1:8000", "[::1]:8000", "gpu-node-03", "vllm-0@pool-a", "a" * 200):
        assert validate_node_id(ok) == ok
    for bad in ("", "a" * 201, "http://x:1/", "a b", "x\x00", "<script>", None, 5):
        with pytest.raises(NameError_):
            validate_node_id(bad)
    for ok in ("llama-70b_h100", "llama3-70b/h800", "meta-llama/Llama-3.1-70B-Instruct@h100",
               "Qwen/Qwen2.5-72B-Instruct", "a" * 200):
        assert validate_group_name(ok) == ok
    for bad in ("", "-x", "/a", "a/", "a//b", "a/../b", "a b", "a\n", "<script>", "a" * 201, None):
        with pytest.raises(NameError_):
            validate_group_name(bad)


@pytest.mark.parametrize(("name", "slug"), [
    ("llama-70b_h100", "llama-70b_h100"),  # a name allowed before "/ . @" is its own slug: old URLs hold
    ("llama3-70b/h800", "_llama3-70b-h800"),
    ("meta-llama/Llama-3.1-70B-Instruct@h100", "_meta-llama-Llama-3-1-70B-Instruct-h100"),
    ("a.b", "_a-b"),
    ("a-b", "a-b"),
])
def test_group_slugs(name, slug):
    assert group_slug(name) == slug and SLUG_RE.fullmatch(slug)


@given(st.from_regex(GROUP_NAME_RE, fullmatch=True))
def test_every_valid_group_name_has_a_url_safe_slug(name):
    assert SLUG_RE.fullmatch(group_slug(name)) and len(group_slug(name)) <= 210


@given(st.from_regex(GROUP_NAME_RE, fullmatch=True), st.from_regex(GROUP_NAME_RE, fullmatch=True))
def test_a_slug_is_its_own_name_or_no_name_at_all(name, other):
    """Whichever group came first: a name that is a slug gets it; any other name's slug (numbered
    too) is no valid name, so no later group's name can ever find its own slug taken."""
    taken = {unique_group_slug(other, set())} if other != name else set()
    slug = unique_group_slug(name, taken)
    assert slug not in taken
    if SLUG_RE.fullmatch(name):
        assert slug == name
    else:
        assert not GROUP_NAME_RE.fullmatch(slug) and SLUG_RE.fullmatch(slug)


def test_scrape_urls():
    assert validate_scrape_url("") == ""
    assert validate_scrape_url("http://127.0.0.1:9400/metrics") == "http://127.0.0.1:9400/metrics"
    for bad in ("file:///etc/passwd", "http://u:p@127.0.0.1/metrics", "http://127.0.0.1/m?x=1",
                "http://127.0.0.1/m#f", "http://169.254.169.254/latest/meta-data", "http:///metrics",
                "http://127.0.0.1:0/metrics"):
        with pytest.raises(NameError_) as err:
            validate_scrape_url(bad)
        assert err.value.reason == "bad_url"


def test_allow_list_matching():
    allow = [validate_allow_entry(e) for e in ("127.0.0.0/24", ".pool-a.test", "::1/128")]
    assert allow == ["127.0.0.0/24", "pool-a.test", "::1/128"]
    assert host_allowed(parse_address("127.0.0.9:80"), allow)
    assert not host_allowed(parse_address("127.0.1.9:80"), allow)
    assert host_allowed(parse_address("gpu-1.pool-a.test:80"), allow)
    assert host_allowed(parse_address("[::1]:80"), allow)
    assert not host_allowed(parse_address("gpu-1.evilpool-a.test:80"), allow)  # a suffix is whole labels
    for bad in ("com", "127.0.0.0/33", "not a cidr/8", ""):
        with pytest.raises(NameError_):
            validate_allow_entry(bad)


@given(st.text(max_size=80))
def test_parse_address_never_crashes_and_never_yields_a_path(text):
    try:
        addr = parse_address(text)
    except NameError_ as exc:
        assert exc.reason in ("bad_address", "forbidden_address")
        return
    assert addr.base_url.count("/") == 2 and "?" not in addr.base_url and "#" not in addr.base_url
