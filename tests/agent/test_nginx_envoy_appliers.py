"""nginx (real binary: nginx -t, atomic swap, reload) and Envoy (EDS JSON shape) appliers."""

from __future__ import annotations

import json
import os

import pytest

from agent.base import ApplyError
from agent.client import effective_weights
from agent.envoy import CLA_TYPE, EnvoyApplier, seed_discovery_response
from agent.nginx import NginxApplier, render_upstream
from contract.weights_document import parse_document
from harness.gateways import NGINX_BIN, weights_document

SERVERS = {"a": "127.0.0.1:8000", "b": "127.0.0.2:8000", "c": "127.0.0.3:8000"}


def eff(servers=SERVERS, now=0.0, **kw):
    return effective_weights(parse_document(json.dumps(weights_document("llama", 1, servers, generated_at=0.0,
                                                                         **kw))), now=now)


def test_render_upstream():
    text = render_upstream(eff(quarantined=("b",), weights={"c": 35}), "outlier_llama", "max_fails=0")
    assert text.splitlines()[1:] == [
        "upstream outlier_llama {",
        "    server 127.0.0.1:8000 weight=100 max_fails=0;  # a",
        "    server 127.0.0.2:8000 max_fails=0 down;  # b quarantined",
        "    server 127.0.0.3:8000 weight=35 max_fails=0;  # c",
        "}",
    ]
    # Version and time are not in the text: a new version with the same weights renders the same bytes.
    assert render_upstream(eff(quarantined=("b",), weights={"c": 35}), "outlier_llama", "max_fails=0") == text


@pytest.fixture
def nginx_conf(tmp_path):
    """A minimal nginx config that includes the upstream file; nginx -t only (no server started)."""
    include = tmp_path / "upstreams" / "llama.conf"
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n  include {include};\n  server {{ listen 127.0.0.1:1; location / {{ proxy_pass http://outlier_llama; }} }}\n}}\n"
    )
    base = [NGINX_BIN, "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")]
    marker = tmp_path / "reloads"
    # Reload = count calls (the e2e test reloads a running nginx for real).
    reload_cmd = ["sh", "-c", f"echo reload >> {marker}"]
    return include, base, reload_cmd, marker


def test_nginx_validates_swaps_and_skips_unchanged(nginx_conf):
    include, base, reload_cmd, marker = nginx_conf
    applier = NginxApplier(include, "outlier_llama", test_cmd=[*base, "-t", "-q"], reload_cmd=reload_cmd)
    first = applier.apply(eff())
    assert "+ server 127.0.0.2:8000 weight=100;" in first.changes
    assert marker.read_text().count("reload") == 1
    inode = os.stat(include).st_ino

    second = applier.apply(eff(quarantined=("b",)))
    assert second.changes == ["- server 127.0.0.2:8000 weight=100;", "+ server 127.0.0.2:8000 down;"]
    assert os.stat(include).st_ino != inode  # replaced by rename, not rewritten in place
    assert marker.read_text().count("reload") == 2

    mtime = os.stat(include).st_mtime_ns
    assert applier.apply(eff(quarantined=("b",))).changes == []  # nothing changed: nothing written
    assert os.stat(include).st_mtime_ns == mtime and marker.read_text().count("reload") == 2
    assert not [p for p in include.parent.iterdir() if p.name.endswith(".tmp")]


def test_nginx_rejected_config_restores_previous_file(nginx_conf):
    include, base, reload_cmd, marker = nginx_conf
    good = NginxApplier(include, "outlier_llama", test_cmd=[*base, "-t", "-q"], reload_cmd=reload_cmd)
    good.apply(eff())
    before = include.read_text()
    # An extra directive nginx does not know: nginx -t fails, the old file must come back.
    bad = NginxApplier(include, "outlier_llama", test_cmd=[*base, "-t", "-q"], reload_cmd=reload_cmd,
                       directives=["no_such_directive 1"])
    with pytest.raises(ApplyError, match="no_such_directive"):
        bad.apply(eff(quarantined=("a",)))
    assert include.read_text() == before
    assert marker.read_text().count("reload") == 1


# --- Envoy -----------------------------------------------------------------------------------------
# Shape of envoy.config.endpoint.v3.ClusterLoadAssignment as documented in Envoy's API reference
# (endpoint.proto / endpoint_components.proto / core/v3/health_check.proto):
#   cluster_name: string (min_len 1); endpoints: [LocalityLbEndpoints]
#   LocalityLbEndpoints.lb_endpoints: [LbEndpoint]
#   LbEndpoint.endpoint.address.socket_address {address: string, port_value: uint32 <= 65535}
#   LbEndpoint.health_status: HealthStatus enum name; LbEndpoint.load_balancing_weight: UInt32 >= 1
HEALTH_STATUS = {"UNKNOWN", "HEALTHY", "UNHEALTHY", "DRAINING", "TIMEOUT", "DEGRADED"}
LB_ENDPOINT_FIELDS = {"endpoint", "health_status", "metadata", "load_balancing_weight", "endpoint_name"}
ENDPOINT_FIELDS = {"address", "health_check_config", "hostname", "additional_addresses"}


def check_cla_shape(cla: dict) -> None:
    assert set(cla) <= {"@type", "cluster_name", "endpoints", "named_endpoints", "policy"}
    assert cla["@type"] == CLA_TYPE
    assert isinstance(cla["cluster_name"], str) and cla["cluster_name"]
    for locality in cla["endpoints"]:
        assert set(locality) <= {"locality", "lb_endpoints", "load_balancing_weight", "priority"}
        for ep in locality["lb_endpoints"]:
            assert set(ep) <= LB_ENDPOINT_FIELDS
            assert set(ep["endpoint"]) <= ENDPOINT_FIELDS
            sa = ep["endpoint"]["address"]["socket_address"]
            assert isinstance(sa["address"], str) and sa["address"]
            assert isinstance(sa["port_value"], int) and 0 <= sa["port_value"] <= 65535
            assert ep["health_status"] in HEALTH_STATUS
            assert isinstance(ep["load_balancing_weight"], int) and ep["load_balancing_weight"] >= 1


def seeded(tmp_path, servers=SERVERS):
    """The EDS file as the operator writes it first (docs/gateways.md): the agent edits only that."""
    path = tmp_path / "eds" / "llama.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(seed_discovery_response(servers, "llama")))
    return path


def endpoints(path):
    return {e["endpoint"]["hostname"]: e for e in json.loads(path.read_text())["resources"][0]["endpoints"][0]["lb_endpoints"]}


def test_envoy_seed_and_applied_file_have_the_cla_shape_weights_and_draining(tmp_path):
    path = seeded(tmp_path)
    check_cla_shape(json.loads(path.read_text())["resources"][0])
    EnvoyApplier(path, "llama").apply(eff(quarantined=("b",), weights={"c": 35}))
    body = json.loads(path.read_text())
    assert set(body) == {"version_info", "resources"} and len(body["resources"]) == 1
    check_cla_shape(body["resources"][0])
    eps = endpoints(path)
    assert (eps["a"]["health_status"], eps["a"]["load_balancing_weight"]) == ("HEALTHY", 100)
    assert (eps["b"]["health_status"], eps["b"]["load_balancing_weight"]) == ("DRAINING", 1)  # never 0
    assert eps["c"]["load_balancing_weight"] == 35
    assert eps["a"]["endpoint"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8000}


def test_envoy_file_written_by_rename_and_only_on_change(tmp_path):
    path = seeded(tmp_path)
    applier = EnvoyApplier(path, "llama")
    inode = os.stat(path).st_ino
    assert applier.apply(eff()).changes == []  # the seed already says so: not rewritten
    assert os.stat(path).st_ino == inode
    result = applier.apply(eff(quarantined=("a",)))
    assert result.changes == ["127.0.0.1:8000 DRAINING weight=1 (was HEALTHY weight=100)"]
    assert os.stat(path).st_ino != inode  # a new file moved into place: what Envoy's watcher needs
    version = json.loads(path.read_text())["version_info"]
    assert applier.apply(eff(quarantined=("a",))).changes == []
    assert json.loads(path.read_text())["version_info"] == version


def test_envoy_fail_open_puts_everyone_back_healthy(tmp_path):
    path = seeded(tmp_path)
    EnvoyApplier(path, "llama").apply(eff(quarantined=("a",)))
    EnvoyApplier(path, "llama").apply(eff(now=10_000.0, quarantined=("a",)))  # stale document
    assert {(e["health_status"], e["load_balancing_weight"]) for e in endpoints(path).values()} == {("HEALTHY", 100)}


def test_envoy_edits_only_the_endpoints_the_file_lists(tmp_path):
    """The operator owns the cluster's membership: a node the file does not list is skipped, an
    endpoint no node matches is left as it is, and every locality is read."""
    path = tmp_path / "llama.json"
    body = seed_discovery_response({"a": SERVERS["a"]}, "llama")
    body["resources"][0]["endpoints"].append(
        seed_discovery_response({"b": SERVERS["b"], "x": "127.0.0.9:8000"}, "llama")["resources"][0]["endpoints"][0])
    path.write_text(json.dumps(body))
    result = EnvoyApplier(path, "llama").apply(eff(quarantined=("b",), weights={"c": 35}))
    assert result.missing == ["c (127.0.0.3:8000)"] and result.unknown == ["127.0.0.9:8000"]
    eps = [e for loc in json.loads(path.read_text())["resources"][0]["endpoints"] for e in loc["lb_endpoints"]]
    assert [(e["endpoint"]["hostname"], e["health_status"]) for e in eps] == [
        ("a", "HEALTHY"), ("b", "DRAINING"), ("x", "HEALTHY")]


def test_envoy_without_its_file_or_with_another_cluster_refuses(tmp_path):
    with pytest.raises(ApplyError, match=r"no file at .* write the EDS file first"):
        EnvoyApplier(tmp_path / "none.json", "llama").apply(eff())
    assert not (tmp_path / "none.json").exists()
    path = seeded(tmp_path)
    with pytest.raises(ApplyError, match="no ClusterLoadAssignment for cluster 'other'"):
        EnvoyApplier(path, "other").apply(eff())
