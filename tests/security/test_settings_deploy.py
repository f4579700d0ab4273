"""Production settings: ``manage.py check --deploy`` passes with DEBUG off by default, SECRET_KEY and
ALLOWED_HOSTS are required from the environment, cookies are secure, security headers are sent."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def _production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DJANGO_DEBUG", "OUTLIER_TESTING", "SECRET_KEY", "SECRET_KEY_FILE", "ALLOWED_HOSTS"}}
    env["DJANGO_SETTINGS_MODULE"] = "outlier_admin.settings"
    env.update(extra)
    return env


def _run(code_or_args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_check_deploy_passes_with_production_settings():
    env = _production_env(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="outlier.example.com")
    proc = _run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues" in proc.stdout
    probe = ("import django; django.setup(); from django.conf import settings as s; "
             "print(s.DEBUG, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, "
             "s.SECURE_HSTS_SECONDS >= 31536000, s.X_FRAME_OPTIONS)")
    out = _run(["-c", probe], env).stdout.split()
    assert out == ["False", "True", "True", "True", "True", "DENY"]


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS"])
def test_production_refuses_to_start_without_secret_key_or_allowed_hosts(missing):
    given = {"SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "outlier.example.com"}
    given.pop(missing)
    proc = _run(["manage.py", "check"], _production_env(**given))
    assert proc.returncode != 0
    # One line that says what to set (issue 35), not Django's ImproperlyConfigured traceback.
    assert missing in proc.stderr and "DJANGO_DEBUG=1" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_debug_mode_runs_without_configuration():
    proc = _run(["manage.py", "check"], _production_env(DJANGO_DEBUG="1"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.django_db
def test_security_headers_on_every_response(client):
    resp = client.get("/healthz")
    assert resp["X-Content-Type-Options"] == "nosniff"
    assert resp["Referrer-Policy"] == "same-origin"
    assert resp["Cross-Origin-Opener-Policy"] == "same-origin"
    resp = client.get("/accounts/login/")
    assert resp["X-Frame-Options"] == "DENY"
    assert "csrftoken" in resp.cookies and resp.cookies["csrftoken"]["samesite"] == "Lax"


def test_no_secrets_in_the_repository():
    """Tracked files hold no private keys, cloud keys or hard-coded Django secret keys."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.split()
    patterns = {
        "private key": "-----BEGIN " + "PRIVATE KEY-----",
        "RSA private key": "-----BEGIN RSA " + "PRIVATE KEY-----",
        # Real token shapes only, so this file's own patterns never match themselves.
        "GitHub token": re.compile("gh" + r"p_[A-Za-z0-9]{36}"),
        "AWS access key": re.compile("AK" + r"IA[0-9A-Z]{16}"),
    }

    secret_key = re.compile(r"SECRET_KEY\s*[=:]\s*['\"]?([A-Za-z0-9!@#$%^&*()_+\-=]{30,})")
    found = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".png", ".jpg", ".gz", ".zst", ".parquet", ".sqlite3"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for what, needle in patterns.items():
            hit = needle.search(text) if isinstance(needle, re.Pattern) else needle in text
            if hit:
                found.append((name, what))
        for m in secret_key.finditer(text):
            if "change-me" not in m.group(1) and "insecure" not in m.group(1):
                found.append((name, "SECRET_KEY value"))
    assert not found, found


@pytest.mark.django_db
def test_demo_credentials_exist_only_in_demo_mode():
    """Migrations (what production runs) create roles, never a user: the demo's logins are made by
    the demo itself."""
    from django.contrib.auth.models import User

    assert not User.objects.exists()
