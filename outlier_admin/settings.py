"""Django settings, read from the environment (12-factor). See README "Configuration"."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from outlier_admin.env import envbool, envlist, envstr

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = envbool("DJANGO_DEBUG", False)
SECRET_KEY = envstr("SECRET_KEY") or ("insecure-dev-only-key" if DEBUG else "insecure-test-key")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.staticfiles",
    "rest_framework",
]
ROOT_URLCONF = "outlier_admin.urls"
DATABASES = {
    "default": dj_database_url.parse(
        envstr("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'outlier_admin.sqlite3'}", conn_max_age=60
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
REDIS_URL = envstr("REDIS_URL") or "redis://127.0.0.1:6379/0"
USE_TZ = True
STATIC_URL = "static/"
