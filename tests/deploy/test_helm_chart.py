"""The Helm chart (deploy/helm/outlier-admin), rendered by the real Helm binary (`make helm`) and every
manifest validated against the Kubernetes JSON schemas (kubernetes-validate) and, for the Prometheus
Operator kinds, against the CRDs' own schemas (tests/deploy/schemas). Then what the schemas cannot
say: one beat, the migration hook's order, commands that exist, settings that exist, secrets that
never reach the environment, selectors that select, the rules file's groups in the PrometheusRule."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.test_compose import ROOT, check_command

CHART = ROOT / "deploy" / "helm" / "outlier-admin"
RULES = ROOT / "deploy" / "prometheus" / "outlier-admin-rules.yml"
SCHEMAS = Path(__file__).parent / "schemas"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas we have.
K8S_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
HELM = shutil.which("helm") or str(ROOT / ".venv" / "bin" / "helm")

BASE = {
    "secrets": {"databaseUrl": "postgres://oa:pw@127.0.0.1:5432/outlier_admin",
                "redisUrl": "redis://127.0.0.1:6379/0", "metricsToken": "scrape-token-1"},
    "allowedHosts": ["oa.example.com"],
}
FULL = {
    **BASE,
    "web": {"ingress": {"enabled": True, "className": "nginx"}},
    "worker": {"replicas": 5},
    "scraper": {"shards": 2, "replicasPerShard": 2},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "prometheusRule": {"enabled": True}},
    "gatewayExample": {"enabled": True, "group": "llama3-70b",
                       "haproxy": {"servers": ["127.0.0.1:18001", "127.0.0.2:18001"]}},
}

pytestmark = [
    pytest.mark.skipif(not os.access(HELM, os.X_OK), reason="no helm binary: run `make helm`"),
    pytest.mark.skipif(not RULES.exists(), reason="deploy/prometheus/outlier-admin-rules.yml (the alerting rules) not in this tree"),
]


def helm(*args: str, values: dict[str, Any] | None = None, tmp_path: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [HELM, *args, str(CHART)]
    if values is not None:
        assert tmp_path is not None
        vf = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        vf.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(vf)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def render(tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm("template", "rel", values=values, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                out.append((f"{d['metadata']['name']}/{c['name']}", c))
    return out


def strict(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists properties (the API server's strict
    field validation; CRD schemas leave additionalProperties open and would prune silently)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if isinstance(schema.get("pattern"), str) and schema["pattern"].startswith("^(?i)"):
            schema["pattern"] = "(?i)^" + schema["pattern"][5:]  # Go's flag placement, Python's order
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


CRD_SCHEMAS = {
    kind: strict(json.loads((SCHEMAS / f"{kind.lower()}-monitoring.coreos.com-v1.json").read_text()))
    for kind in ("ServiceMonitor", "PrometheusRule")
}


def validate(doc: dict[str, Any], version: str) -> None:
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("full"), FULL)


def test_helm_lint_strict_passes_with_every_option_on(tmp_path: Path) -> None:
    out = helm("lint", "--strict", values=FULL, tmp_path=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_manifest_is_valid_kubernetes(full: list[dict[str, Any]], version: str) -> None:
    kinds = sorted({d["kind"] for d in full})
    assert kinds == ["ConfigMap", "Deployment", "Ingress", "Job", "PodDisruptionBudget", "PrometheusRule",
                     "Secret", "Service", "ServiceMonitor"]
    for doc in full:
        validate(doc, version)


def test_the_validators_reject_what_kubernetes_would(full: list[dict[str, Any]]) -> None:
    """The validation above can fail: an unknown field, a wrong type, a CR field that does not exist."""
    web = copy.deepcopy(by_kind(full, "Deployment")["rel-outlier-admin-web"])
    web["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(web, K8S_VERSIONS[-1])
    web = copy.deepcopy(by_kind(full, "Deployment")["rel-outlier-admin-web"])
    web["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(web, K8S_VERSIONS[-1])
    sm = copy.deepcopy(next(iter(by_kind(full, "ServiceMonitor").values())))
    sm["spec"]["endpoints"][0]["bearerTokenSecrett"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(sm, K8S_VERSIONS[-1])


def test_missing_or_out_of_bounds_values_are_refused(tmp_path: Path) -> None:
    out = helm("template", "rel", values={"allowedHosts": ["oa.example.com"]}, tmp_path=tmp_path)
    assert out.returncode != 0 and "secrets.databaseUrl" in out.stderr
    for bad, field in [({"web": {"replicas": 0}}, "/web/replicas"),
                       ({"config": {"SECRET_KEY": "x"}}, "SECRET_KEY"),  # secrets never in the ConfigMap
                       ({"beat": {"replicas": 3}}, "/beat"),  # not a value: exactly one beat
                       ({"gatewayExample": {"haproxy": {"servers": ["http://127.0.0.1:1/x"]}}}, "servers")]:
        out = helm("template", "rel", values={**BASE, **bad}, tmp_path=tmp_path)
        assert out.returncode != 0 and field in out.stderr, (bad, out.stderr)


def test_exactly_one_beat_and_workers_scale(full: list[dict[str, Any]], tmp_path: Path) -> None:
    deps = by_kind(full, "Deployment")
    beat = deps["rel-outlier-admin-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"] == {"type": "Recreate"}
    assert deps["rel-outlier-admin-worker"]["spec"]["replicas"] == 5
    # The scraper: one Deployment per shard, all with the same N, replicas = hot standbys.
    shards = sorted(d["spec"]["template"]["spec"]["containers"][0]["args"][-1]
                    for name, d in deps.items() if "-scraper-" in name)
    assert shards == ["0/2", "1/2"]
    assert all(d["spec"]["replicas"] == 2 for name, d in deps.items() if "-scraper-" in name)
    auto = render(tmp_path, {**BASE, "worker": {"autoscaling": {"enabled": True, "maxReplicas": 12}}})
    worker = by_kind(auto, "Deployment")["rel-outlier-admin-worker"]["spec"]
    assert "replicas" not in worker  # the HPA owns it
    hpa = by_kind(auto, "HorizontalPodAutoscaler")["rel-outlier-admin-worker"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "rel-outlier-admin-worker" and hpa["maxReplicas"] == 12
    for doc in auto:
        validate(doc, K8S_VERSIONS[-1])


def test_pods_run_as_the_images_user_on_a_read_only_root(full: list[dict[str, Any]]) -> None:
    uid = re.search(r"useradd --system --uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert uid, "the Dockerfile's user has no fixed uid"
    for d in by_kind(full, "Deployment").values():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(uid.group(1)) and pod["securityContext"]["runAsNonRoot"]
        for c in pod["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            if c["image"].startswith("outlier-admin:"):  # writable: /tmp (beat's schedule) and the metrics dir
                mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                assert "/tmp" in mounts
                assert "/run/prometheus" in mounts or env.get("PROMETHEUS_MULTIPROC_DIR") == ""


def test_migrations_run_as_a_hook_after_their_secret_and_config(full: list[dict[str, Any]]) -> None:
    """Helm runs hooks by weight before the release's resources: the Job needs the Secret and the
    ConfigMap, so they are hooks too, with a lower weight."""
    def hook(doc: dict[str, Any]) -> tuple[set[str], int]:
        ann = doc["metadata"]["annotations"]
        return set(ann["helm.sh/hook"].split(",")), int(ann["helm.sh/hook-weight"])

    job = by_kind(full, "Job")["rel-outlier-admin-migrate"]
    phases, weight = hook(job)
    assert phases == {"pre-install", "pre-upgrade"}
    for dep in (by_kind(full, "Secret")["rel-outlier-admin-secrets"], by_kind(full, "ConfigMap")["rel-outlier-admin-config"]):
        dep_phases, dep_weight = hook(dep)
        assert phases <= dep_phases and dep_weight < weight
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["outlier-admin", "migrate", "--noinput"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_every_container_command_exists(full: list[dict[str, Any]]) -> None:
    from django.core.management import get_commands

    for name, c in containers(full):
        if c["image"].startswith("haproxy:"):
            continue
        check_command(c.get("args") or c["command"])  # the proxy's nginx: its command, not the image's
        if c.get("args", [""])[0] == "outlier-admin":  # manage.py: the management command exists
            assert c["args"][1] in get_commands(), c["args"]
        if name.endswith("/outlier-agent"):
            from agent.__main__ import build_applier, build_parser

            args = build_parser().parse_args(c["args"][1:])
            assert args.gateway == "haproxy" and args.group == "llama3-70b"
            build_applier(args)  # raises SystemExit on a missing option


def test_secrets_are_files_and_every_variable_is_a_setting(full: list[dict[str, Any]]) -> None:
    """Secret values never appear in a pod spec; each NAME_FILE is read by the settings' envstr
    (which reads NAME_FILE), and each plain variable is one the code reads."""
    settings = (ROOT / "outlier_admin" / "settings.py").read_text()
    read_anywhere = settings + (ROOT / "outlier_admin" / "observability" / "gunicorn_conf.py").read_text()
    secret = by_kind(full, "Secret")["rel-outlier-admin-secrets"]["stringData"]
    assert set(secret) == {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "METRICS_TOKEN"}
    assert len(secret["SECRET_KEY"]) == 50
    for name, c in containers(full):
        text = json.dumps(c)
        for key, value in secret.items():
            assert value not in text, f"{name}: the value of {key} is in the pod spec"
        for env in c.get("env", []):
            if env["name"].endswith("_FILE"):
                assert re.search(rf'envstr\("{env["name"].removesuffix("_FILE")}"', settings), env["name"]
                assert env["value"].startswith("/etc/outlier-admin/secrets/")
            elif env["name"] not in ("POD_IP", "REDIS_URL"):  # the agent reads REDIS_URL itself
                assert f'"{env["name"]}"' in read_anywhere or f"'{env['name']}'" in read_anywhere, env["name"]
    config = by_kind(full, "ConfigMap")["rel-outlier-admin-config"]["data"]
    for key in config:
        assert key == "DJANGO_SETTINGS_MODULE" or f'"{key}"' in settings, f"ConfigMap {key}: no such setting"


def test_probes_and_prometheus_reach_the_pod_by_ip(full: list[dict[str, Any]]) -> None:
    """kubelet and Prometheus send ``Host: <pod IP>:<port>``, which Django refuses unless it is in
    ALLOWED_HOSTS: the pod's IP is appended through the downward API."""
    web = by_kind(full, "Deployment")["rel-outlier-admin-web"]["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in web["env"]]
    assert names.index("POD_IP") < names.index("ALLOWED_HOSTS")  # $(POD_IP) expands only from earlier vars
    allowed = next(e["value"] for e in web["env"] if e["name"] == "ALLOWED_HOSTS")
    assert allowed == "oa.example.com,$(POD_IP)"
    from django.conf import settings
    from django.urls import resolve

    for probe in ("readinessProbe", "startupProbe"):  # through the nginx sidecar's port
        path = web[probe]["httpGet"]["path"]
        assert resolve(path).func.__name__ in ("healthz", "readyz"), path
        assert web[probe]["httpGet"]["port"] == "http"
        # Plain HTTP from kubelet: the path must be exempt from the SSL redirect.
        assert any(re.match(rx, path.lstrip("/")) for rx in settings.SECURE_REDIRECT_EXEMPT), path
    # Liveness asks gunicorn itself on loopback (only it is restarted), with the pod's IP as Host.
    live = web["livenessProbe"]["exec"]["command"]
    assert live[:2] == ["python", "-c"] and "127.0.0.1" in live[2] and "/healthz" in live[2] and "POD_IP" in live[2]


def test_services_and_monitors_select_real_pods_and_ports(full: list[dict[str, Any]]) -> None:
    pods = [(d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"]["containers"])
            for d in by_kind(full, "Deployment").values()]
    for d in by_kind(full, "Deployment").values():
        assert d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    services = by_kind(full, "Service")
    for name, svc in services.items():
        matched = [cs for labels, cs in pods if svc["spec"]["selector"].items() <= labels.items()]
        assert matched, f"{name} selects no pod"
        for cs in matched:
            port_names = {p["name"] for c in cs for p in c.get("ports", [])}
            assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names, name
    sm = by_kind(full, "ServiceMonitor")["rel-outlier-admin"]
    selected = [s for s in services.values() if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    selected_ports = {p["name"] for s in selected for p in s["spec"]["ports"]}
    assert {e["port"] for e in sm["spec"]["endpoints"]} == {"http", "metrics"} <= selected_ports
    assert sm["metadata"]["labels"]["release"] == "kps"
    for e in sm["spec"]["endpoints"]:
        assert e["authorization"]["credentials"] == {"name": "rel-outlier-admin-secrets", "key": "METRICS_TOKEN"}
    worker = by_kind(full, "Deployment")["rel-outlier-admin-worker"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["WORKER_METRICS_BIND"] == "0.0.0.0" and int(env["WORKER_METRICS_PORT"]) == worker["ports"][0]["containerPort"]


def test_the_prometheus_rule_carries_exactly_the_rules_file(full: list[dict[str, Any]]) -> None:
    """One owner of the rules: the chart's file is a symlink to deploy/prometheus's."""
    link = CHART / "files" / "outlier-admin-rules.yml"
    assert link.is_symlink() and link.resolve() == RULES.resolve()
    rule = by_kind(full, "PrometheusRule")["rel-outlier-admin"]
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_a_packaged_chart_carries_the_rules_themselves(tmp_path: Path) -> None:
    """`helm package` (what a chart repository serves) follows the symlink: the archive holds the file."""
    out = subprocess.run([HELM, "package", str(CHART), "-d", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with tarfile.open(next(tmp_path.glob("outlier-admin-*.tgz"))) as tgz:
        member = tgz.getmember("outlier-admin/files/outlier-admin-rules.yml")
        assert member.isfile()
        assert tgz.extractfile(member).read() == RULES.read_bytes()


def test_the_gateway_example_wires_the_agent_to_haproxy(full: list[dict[str, Any]], tmp_path: Path) -> None:
    cfg = by_kind(full, "ConfigMap")["rel-outlier-admin-gateway-example"]["data"]["haproxy.cfg"]
    agent = dict(containers(full))["rel-outlier-admin-gateway-example/outlier-agent"]
    opts = dict(a.removeprefix("--").split("=", 1) for a in agent["args"] if a.startswith("--") and "=" in a)
    assert f"stats socket {opts['haproxy-socket']} " in cfg
    assert f"backend {opts['haproxy-backend']}\n" in cfg
    assert re.findall(r"server s\d+ (\S+) weight 256", cfg) == ["127.0.0.1:18001", "127.0.0.2:18001"]
    haproxy = shutil.which("haproxy")
    if haproxy:  # the real HAProxy parses the rendered configuration
        conf = tmp_path / "haproxy.cfg"
        conf.write_text(cfg.replace(opts["haproxy-socket"], str(tmp_path / "admin.sock")))
        out = subprocess.run([haproxy, "-c", "-f", str(conf)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr


def test_the_install_notes_name_commands_that_exist(tmp_path: Path) -> None:
    from django.core.management import get_commands

    out = helm("install", "rel", "--dry-run=client", values=BASE, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "beat     exactly 1 pod" in notes
    commands = re.findall(r"outlier-admin ([a-z_]+) ", notes)
    assert {"create_token", "create_group", "register_node"} <= set(commands)
    assert set(commands) <= set(get_commands())


def test_every_web_pod_runs_the_shipped_nginx_in_front_of_a_loopback_gunicorn(full: list[dict[str, Any]],
                                                                               tmp_path: Path) -> None:
    """Issue 29: slow clients held gunicorn's threads. The web pod's Service port is nginx's, which runs
    deploy/nginx/nginx.conf with only its upstream made gunicorn on the pod's loopback; gunicorn binds
    127.0.0.1 and trusts the sidecar's X-Forwarded-For (login throttling counts per client)."""
    from tests.reliability import stack

    link = CHART / "files" / "nginx.conf"
    assert link.is_symlink() and link.resolve() == stack.NGINX_CONF.resolve()
    dep = by_kind(full, "Deployment")["rel-outlier-admin-web"]
    pod = dep["spec"]["template"]["spec"]
    web, ingest, proxy = pod["containers"]
    assert (web["name"], ingest["name"], proxy["name"]) == ("web", "ingest", "proxy")
    assert dep["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "web"
    env = {e["name"]: e.get("value") for e in web["env"]}
    assert env["WEB_BIND"] == "127.0.0.1" and env["TRUSTED_PROXIES"] == "127.0.0.1"
    assert "ports" not in web  # nothing outside the pod reaches gunicorn
    conf = by_kind(full, "ConfigMap")["rel-outlier-admin-web-proxy"]["data"]["nginx.conf"]
    ingest_env = {e["name"]: e.get("value") for e in ingest["env"]}
    assert conf.rstrip("\n") == stack.NGINX_CONF.read_text().replace(
        "server web:8000;", f"server 127.0.0.1:{env['PORT']};").replace(
        "server ingest:8000;", f"server 127.0.0.1:{ingest_env['PORT']};").rstrip("\n")
    mount = next(m for m in proxy["volumeMounts"] if m["name"] == "proxy-config")
    assert proxy["command"][proxy["command"].index("-c") + 1] == mount["mountPath"]
    assert {"name": "proxy-tmp", "mountPath": "/tmp"} in proxy["volumeMounts"]  # pid, temp files: -p /tmp/
    assert proxy["ports"] == [{"name": "http", "containerPort": 8080}] and "listen 8080;" in conf
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/nginx-healthz", "port": "http"}
    assert by_kind(full, "Service")["rel-outlier-admin-web"]["spec"]["ports"][0]["targetPort"] == "http"
    # The real nginx parses the rendered file (listener moved to a free port: tests run side by side).
    out = stack.nginx_check(conf.replace("listen 8080;", "listen 127.0.0.1:18081;"), tmp_path)
    assert out.returncode == 0, out.stderr
    # A TLS proxy of the operator's, named in config, is trusted as well; port 8080 is nginx's.
    more = render(tmp_path, {**BASE, "config": {"TRUSTED_PROXIES": "127.0.4.0/24"}})
    web = by_kind(more, "Deployment")["rel-outlier-admin-web"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in web["env"]}["TRUSTED_PROXIES"] == "127.0.0.1,127.0.4.0/24"
    out = helm("template", "rel", values={**BASE, "web": {"port": 8080}}, tmp_path=tmp_path)
    assert out.returncode != 0 and "/web/port" in out.stderr


def test_ingest_runs_its_own_gunicorn_in_the_web_pod_and_the_ingress_range_is_trusted(tmp_path: Path) -> None:
    """Issue 36: ingest's own process group (a container with its own CPU limit; the pod's nginx routes
    /api/v1/ingest/ to it), and behind an Ingress the client's address, not the ingress pod's: nginx's
    set_real_ip_from and the app's TRUSTED_PROXIES both from web.trustedProxies."""
    from tests.reliability import stack

    docs = render(tmp_path, {**BASE, "web": {"trustedProxies": ["192.0.2.0/24", "2001:db8::/64"]}})
    pod = by_kind(docs, "Deployment")["rel-outlier-admin-web"]["spec"]["template"]["spec"]
    web, ingest, _ = pod["containers"]
    env = {c["name"]: {e["name"]: e.get("value") for e in c["env"]} for c in (web, ingest)}
    assert ingest["args"] == web["args"] and env["ingest"]["WEB_BIND"] == "127.0.0.1"
    assert env["ingest"]["PORT"] != env["web"]["PORT"] and "ports" not in ingest
    assert ingest["resources"]["limits"]["cpu"]
    trusted = "127.0.0.1,192.0.2.0/24,2001:db8::/64"
    assert env["web"]["TRUSTED_PROXIES"] == env["ingest"]["TRUSTED_PROXIES"] == trusted
    conf = by_kind(docs, "ConfigMap")["rel-outlier-admin-web-proxy"]["data"]["nginx.conf"]
    assert "set_real_ip_from 192.0.2.0/24;" in conf and "set_real_ip_from 2001:db8::/64;" in conf
    assert f"server 127.0.0.1:{env['ingest']['PORT']};" in conf
    out = stack.nginx_check(conf.replace("listen 8080;", "listen 127.0.0.1:18082;"), tmp_path)
    assert out.returncode == 0, out.stderr
    out = helm("template", "rel", values={**BASE, "web": {"port": 8001}}, tmp_path=tmp_path)
    assert out.returncode != 0 and "web.ingest.port" in out.stderr
    out = helm("template", "rel", values={**BASE, "web": {"trustedProxies": ["ingress.local"]}}, tmp_path=tmp_path)
    assert out.returncode != 0 and "trustedProxies" in out.stderr
