"""The OpenAPI schema is one a generated client can use: openapi-python-client (the generator SREs use)
writes a client from it, every module of that client imports, and the client lists nodes by name and
quarantines one against the real server (``live_server``), reading errors as problems.

Before issue 17, 9 of the 30 endpoint modules of such a client failed to import (every action offered
JSON, form and multipart bodies), only 200/201 were documented, and the ingest endpoint was missing."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from outlier_admin.api.errors import PROBLEM_CONTENT_TYPE

PACKAGE = "outlier_admin_generated_client"


def _schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


@pytest.fixture(scope="module")
def generated(tmp_path_factory, django_db_blocker) -> Path:
    """The client generated from the served schema, importable as :data:`PACKAGE`."""
    root = tmp_path_factory.mktemp("client")
    with django_db_blocker.unblock():
        (root / "schema.json").write_text(json.dumps(_schema()))
    tool = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    assert tool, "openapi-python-client is a dev dependency (pyproject.toml)"
    run = subprocess.run([tool, "generate", "--path", str(root / "schema.json"), "--output-path",
                          str(root / PACKAGE), "--meta", "none"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    sys.path.insert(0, str(root))
    yield root / PACKAGE
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_every_generated_module_imports(generated):
    modules = sorted(p for p in (generated / "api").rglob("*.py") if p.name != "__init__.py")
    names = {p.stem for p in modules}
    assert {"v1_nodes_list", "v1_nodes_create", "v1_nodes_partial_update", "v1_groups_create",
            "v1_groups_partial_update", "v1_nodes_quarantine_create", "v1_ingest_requests_create"} <= names
    failed = {}
    for path in modules:
        dotted = ".".join((PACKAGE, *path.relative_to(generated).with_suffix("").parts))
        try:
            importlib.import_module(dotted)
        except Exception as exc:  # every failure, not only the first
            failed[dotted] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed


@pytest.mark.django_db
def test_the_schema_offers_json_bodies_and_documents_every_error_as_a_problem():
    doc = _schema()
    assert "/api/v1/ingest/requests" in doc["paths"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            if "requestBody" in op and not path.startswith("/api/v1/ingest/"):
                assert set(op["requestBody"]["content"]) == {"application/json"}, (method, path)
            codes = set(op["responses"])
            assert any(c.startswith("2") for c in codes) and {"401", "500"} <= codes, (method, path, codes)
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")):
                    assert response["content"] == {PROBLEM_CONTENT_TYPE: {
                        "schema": {"$ref": "#/components/schemas/Problem"}}}, (method, path, code)


@pytest.mark.django_db(transaction=True)
def test_generated_client_lists_nodes_by_name_and_quarantines_one(generated, live_server):
    from django.contrib.auth.models import Group, User

    from outlier_admin.control.actions import do_create_group, do_create_token, do_register_node
    from outlier_admin.control.models import AuditEvent, Override

    oncall = User.objects.create_user("client-oncall")
    oncall.groups.add(Group.objects.get_or_create(name="oncall")[0])  # roles may be flushed by earlier tests
    group = do_create_group("client-g", actor="test")
    nodes = [do_register_node(group, f"127.0.8.{i}:8000", actor="test") for i in range(3)]
    _, token = do_create_token(name="generated-client", scope="api", actor="test", user=oncall)

    client_mod = importlib.import_module(f"{PACKAGE}.client")
    nodes_list = importlib.import_module(f"{PACKAGE}.api.v1.v1_nodes_list")
    quarantine = importlib.import_module(f"{PACKAGE}.api.v1.v1_nodes_quarantine_create")
    models = importlib.import_module(f"{PACKAGE}.models")
    api = client_mod.AuthenticatedClient(base_url=live_server.url, token=token, raise_on_unexpected_status=True)

    everything = nodes_list.sync(client=api)
    assert everything.count == 3 and {n.name for n in everything.results} == {n.name for n in nodes}
    page = nodes_list.sync(client=api, name=nodes[1].name)
    assert page.count == 1 and page.results[0].id == nodes[1].pk and page.results[0].group == "client-g"

    done = quarantine.sync(client=api, id=nodes[1].pk,
                           body=models.OverrideInput(reason="ECC errors (generated client)", expires_in_s=600.0))
    assert isinstance(done, models.Override), done
    assert (done.node, done.kind, done.reason) == (nodes[1].pk, "quarantine", "ECC errors (generated client)")
    row = Override.objects.get(pk=done.id)
    assert row.node_id == nodes[1].pk and row.expires_at is not None
    assert AuditEvent.objects.filter(action="node.quarantine", node=nodes[1], user=oncall).count() == 1

    refused = quarantine.sync_detailed(client=api, id=nodes[2].pk, body=models.OverrideInput(reason=" "))
    assert refused.status_code == 400 and isinstance(refused.parsed, models.Problem)
    assert refused.parsed.status == 400 and "reason" in refused.parsed.detail
    assert not Override.objects.filter(node=nodes[2]).exists()
