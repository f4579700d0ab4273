"""Django settings, read from the environment (12-factor). See README "Configuration"."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from contract.names import NameError_, validate_allow_entry
from contract.records import Limits as _RecordLimits
from contract.weights_document import DEFAULT_STALE_AFTER_S
from outlier_admin.env import envbool, envint, envlist, envstr

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = envbool("DJANGO_DEBUG", False)
# Production is the default. Only three contexts may run without a configured SECRET_KEY /
# ALLOWED_HOSTS and over plain HTTP: DEBUG, the test suite (pytest imported, or OUTLIER_TESTING=1,
# which the suite exports so the Celery worker / demo it starts as subprocesses inherit it) and the
# in-process demo (``python -m outlier_admin.demo`` imports its package before the settings).
TESTING = "pytest" in sys.modules or envbool("OUTLIER_TESTING", False)
if "pytest" in sys.modules:
    os.environ.setdefault("OUTLIER_TESTING", "1")
DEMO = "outlier_admin.demo" in sys.modules
RELAXED = DEBUG or TESTING or DEMO
SECRET_KEY = envstr("SECRET_KEY") or ""
if not SECRET_KEY:
    if not RELAXED:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment (or SECRET_KEY_FILE) in production")
    SECRET_KEY = "insecure-dev-only-key"  # debug/test/demo only: never reaches a deployment
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if RELAXED else [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set in the environment (comma-separated) in production")

# --- Transport and cookie security (production; debug/test/demo serve plain HTTP on loopback) ---------
# Behind a TLS-terminating proxy set SECURE_PROXY_SSL_HEADER=1 (trusts X-Forwarded-Proto: https).
if envbool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not RELAXED)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = not RELAXED
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if RELAXED else 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Health probes (load balancers, kubelet) speak plain HTTP to the pod: never redirect them.
SECURE_REDIRECT_EXEMPT = [r"^healthz", r"^readyz", r"^metrics"]
# Login throttling: django-axes with the rule in outlier_admin.fleet.login_throttle's docstring.
# LOGIN_MAX_FAILURES failures within LOGIN_LOCKOUT_S lock a username at one client address (the pair):
# nobody locks the on-call out from elsewhere, nor everyone behind a shared address with invented names.
LOGIN_MAX_FAILURES = envint("LOGIN_MAX_FAILURES", 5, minimum=1)
LOGIN_LOCKOUT_S = envint("LOGIN_LOCKOUT_S", 900, minimum=1)
# Peers (addresses or CIDRs) whose X-Forwarded-For names the client; empty: the header is never read.
TRUSTED_PROXIES = envlist("TRUSTED_PROXIES", [])
for _entry in TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_entry, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"TRUSTED_PROXIES entry {_entry!r} is not an IP address or CIDR") from _exc
# Behind a proxy every client would have the proxy's address: anyone's failures would lock everyone out.
if envbool("SECURE_PROXY_SSL_HEADER", False) and not TRUSTED_PROXIES and not RELAXED:
    raise ImproperlyConfigured("SECURE_PROXY_SSL_HEADER=1 (behind a proxy) needs TRUSTED_PROXIES: the proxy's "
                               "address(es), so that login throttling sees each client's own address")
AUTHENTICATION_BACKENDS = [
    "outlier_admin.fleet.login_throttle.LoginThrottleBackend",  # refuses locked-out attempts, counts
    "django.contrib.auth.backends.ModelBackend",  # checks the password
]
AXES_HANDLER = "outlier_admin.fleet.login_throttle.LoginThrottleHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # one key: the pair
AXES_FAILURE_LIMIT = "outlier_admin.fleet.login_throttle.failure_limit"  # LOGIN_MAX_FAILURES
AXES_COOLOFF_TIME = "outlier_admin.fleet.login_throttle.lockout_window"  # LOGIN_LOCKOUT_S
AXES_CLIENT_IP_CALLABLE = "outlier_admin.fleet.login_throttle.client_ip"  # TRUSTED_PROXIES
AXES_USERNAME_CALLABLE = "outlier_admin.fleet.login_throttle.username_of"
AXES_LOCKOUT_CALLABLE = "outlier_admin.fleet.login_throttle.lockout_response"  # 429 + Retry-After
# A success clears the pair's failures (the owner's typos; the key is the pair, so nothing else). Refused
# attempts are not counted (no lock extension, no database writes from a locked-out flood).
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# Content-Security-Policy (django-csp). No inline script or style anywhere; the nonce is added to the
# header only on a page that uses it (the Swagger UI's init script: templates/drf_spectacular/).
# img-src data: for the icons Swagger UI's stylesheet embeds as data: URIs.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "csp",
    "rest_framework",
    "drf_standardized_errors",
    "outlier_admin.fleet",
    "outlier_admin.ingest",
    "outlier_admin.control",
    "outlier_admin.observability",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "outlier_admin.api",
    "outlier_admin.dashboard",
]

MIDDLEWARE = [
    "outlier_admin.api.unstorable.UnstorableInputMiddleware",  # a NUL in a path/query/form: 400, not a 500
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as axes asks: turns a lockout into lockout_response
]

ROOT_URLCONF = "outlier_admin.urls"
# The wheel ships the top-level templates/ as outlier_admin/templates (setup.py); a checkout has them at
# the top. The package's copy first: an installed BASE_DIR is site-packages, whose templates/ is not ours.
TEMPLATES_DIR = next((d for d in (Path(__file__).resolve().parent / "templates", BASE_DIR / "templates")
                      if d.is_dir()), BASE_DIR / "templates")
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [TEMPLATES_DIR],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "outlier_admin.wsgi.application"

# Embedded default (zero-setup demo): SQLite. Tests and deployments set DATABASE_URL (PostgreSQL).
DATABASES = {
    "default": dj_database_url.parse(
        envstr("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'outlier_admin.sqlite3'}", conn_max_age=60
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = envstr("REDIS_URL") or "redis://127.0.0.1:6379/0"
if ("pytest" in sys.modules and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw")
        and REDIS_URL.startswith("redis://")):
    # The suite runs on pytest-xdist workers: each gets its own Redis database number, REDIS_URL's
    # plus one plus its index (as pytest-django gives it its own PostgreSQL database), because a test
    # starts from FLUSHDB of its number. The environment carries it to the processes a test starts
    # (which are not pytest, so they do not move it again).
    from urllib.parse import urlsplit

    _url = urlsplit(REDIS_URL)
    _db = int(_url.path.strip("/") or 0) + 1 + int(os.environ["PYTEST_XDIST_WORKER"][2:] or 0)
    if _db > 15:  # Redis has 16 database numbers; two workers would share one and flush each other's
        raise ImproperlyConfigured(f"pytest-xdist worker {os.environ['PYTEST_XDIST_WORKER']} needs Redis database "
                                   f"{_db}: use fewer workers or a lower database number in REDIS_URL")
    REDIS_URL = os.environ["REDIS_URL"] = _url._replace(path=f"/{_db}").geturl()
# Redis run with Sentinel (docs/redis-ha.md): REDIS_SENTINELS=host:port,host:port,... and
# REDIS_SENTINEL_MASTER=<name> (REDIS_DB, default 0) stand for REDIS_URL=redis+sentinel://host:port,.../<name>/<db>,
# which may also be given as it is. The agents take the same URL (--redis-url).
REDIS_SENTINELS = envlist("REDIS_SENTINELS", [])
REDIS_SENTINEL_MASTER = envstr("REDIS_SENTINEL_MASTER") or ""
if REDIS_SENTINELS:
    if not REDIS_SENTINEL_MASTER:
        raise ImproperlyConfigured("REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER (the monitored master's name) is not")
    REDIS_URL = f"redis+sentinel://{','.join(REDIS_SENTINELS)}/{REDIS_SENTINEL_MASTER}/{envint('REDIS_DB', 0, minimum=0)}"
if REDIS_URL.startswith("redis+sentinel://"):
    from contract.topology import RedisURLError, parse_sentinel_url

    try:
        _SENTINEL = parse_sentinel_url(REDIS_URL)
    except RedisURLError as exc:
        raise ImproperlyConfigured(f"REDIS_URL / REDIS_SENTINELS: {exc}") from None
else:
    _SENTINEL = None
# A Redis Cluster (docs/scale.md): REDIS_CLUSTER_NODES=host:port,host:port,... (any of its nodes) stands for
# REDIS_URL=redis+cluster://host:port,..., which may also be given as it is. Each group's keys share one hash
# slot, so a group's tick and ingest stay single-shard transactions.
REDIS_CLUSTER_NODES = envlist("REDIS_CLUSTER_NODES", [])
if REDIS_CLUSTER_NODES:
    if REDIS_SENTINELS:
        raise ImproperlyConfigured("REDIS_CLUSTER_NODES and REDIS_SENTINELS are both set: a cluster fails over by itself")
    REDIS_URL = f"redis+cluster://{','.join(REDIS_CLUSTER_NODES)}"
if REDIS_URL.startswith("redis+cluster://"):
    from contract.topology import RedisURLError, parse_cluster_url

    try:
        parse_cluster_url(REDIS_URL)
    except RedisURLError as exc:
        raise ImproperlyConfigured(f"REDIS_URL / REDIS_CLUSTER_NODES: {exc}") from None
    if not envstr("CELERY_BROKER_URL"):
        # kombu has no Redis Cluster transport: the broker is a plain Redis (or Sentinel) of its own.
        raise ImproperlyConfigured("REDIS_URL is a Redis Cluster: set CELERY_BROKER_URL to a plain Redis or "
                                   "Sentinel for Celery (kombu cannot use a cluster as its broker)")
# An ingest answered 200 (and a tick's SQL write) waits until this many replicas hold it (Redis WAIT, at
# most REDIS_REPLICA_ACK_TIMEOUT_MS; else 503): replication is asynchronous, and without it a failover
# can lose records the primary had accepted. 0 (default): no wait, a single Redis's behaviour.
REDIS_MIN_REPLICAS_ACK = envint("REDIS_MIN_REPLICAS_ACK", 0, minimum=0)
# Long enough for a replica's acknowledgement over a LAN (well under a millisecond when it is up),
# short enough that an ingest request with no replica to answer it is refused within a second.
REDIS_REPLICA_ACK_TIMEOUT_MS = envint("REDIS_REPLICA_ACK_TIMEOUT_MS", 500, minimum=1)
if REDIS_MIN_REPLICAS_ACK and REDIS_URL.startswith("redis+cluster://"):
    # WAIT counts the replicas of the primary it is sent to; a request spans groups on several primaries.
    raise ImproperlyConfigured("REDIS_MIN_REPLICAS_ACK is not supported with a Redis Cluster REDIS_URL (set it to 0)")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- Celery (broker: CELERY_BROKER_URL, else REDIS_URL) ----------------------------------------------
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL") or REDIS_URL
CELERY_RESULT_BACKEND = None
if CELERY_BROKER_URL.startswith("redis+sentinel://"):
    # kombu's own Sentinel transport: sentinel://h1:p1/db;sentinel://h2:p2/db with the master's name
    # in the transport options (results are ignored; a result backend set later takes the same options).
    from contract.topology import parse_sentinel_url as _parse

    _broker = _parse(CELERY_BROKER_URL)
    _auth = f"{_broker.username or ''}:{_broker.password}@" if _broker.password else ""
    CELERY_BROKER_URL = ";".join(f"sentinel://{_auth}{h}:{p}/{_broker.db}" for h, p in _broker.sentinels)
    CELERY_BROKER_TRANSPORT_OPTIONS = {"master_name": _broker.master, "socket_timeout": 5,
                                       "socket_connect_timeout": 2}
    if _broker.sentinel_password:
        CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = {"password": _broker.sentinel_password}
    CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = CELERY_BROKER_TRANSPORT_OPTIONS
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# --- Control-plane tunables (see README "Configuration") -------------------------------------------------
# Records for an unknown node register it (off: rejected with reason "unknown_node"). Off in
# production by default; when on, only ids that are host:port inside the group's auto_register_allow
# (CIDRs / DNS suffixes), or AUTO_REGISTER_DEFAULT_ALLOW for groups without their own list, and only up
# to MAX_NODES_PER_GROUP live nodes. Groups are never created by ingest, except names matching one of
# the operator's AUTO_CREATE_GROUPS glob patterns (at most MAX_GROUPS groups in all).
AUTO_REGISTER_NODES = envbool("AUTO_REGISTER_NODES", RELAXED)
AUTO_REGISTER_DEFAULT_ALLOW = envlist("AUTO_REGISTER_DEFAULT_ALLOW", ["127.0.0.0/8"] if RELAXED else [])
try:
    AUTO_REGISTER_DEFAULT_ALLOW = [validate_allow_entry(e) for e in AUTO_REGISTER_DEFAULT_ALLOW]
except NameError_ as exc:
    raise ImproperlyConfigured(f"AUTO_REGISTER_DEFAULT_ALLOW: {exc}") from None
MAX_NODES_PER_GROUP = envint("MAX_NODES_PER_GROUP", 1000, minimum=1)
AUTO_CREATE_GROUPS = envlist("AUTO_CREATE_GROUPS", [])
MAX_GROUPS = envint("MAX_GROUPS", 500, minimum=1)
# Bounds of a record's numbers (a record outside them is rejected, never clipped into range); the
# defaults are the records contract's (contract.records.Limits).
_RECORDS = _RecordLimits()
INGEST_MAX_LATENCY_MS = envint("INGEST_MAX_LATENCY_MS", _RECORDS.max_latency_ms, minimum=1000)
INGEST_MAX_PROMPT_TOKENS = envint("INGEST_MAX_PROMPT_TOKENS", _RECORDS.max_prompt_tokens, minimum=1)
INGEST_MAX_COMPLETION_TOKENS = envint("INGEST_MAX_COMPLETION_TOKENS", _RECORDS.max_completion_tokens, minimum=1)
INGEST_MAX_BODY_BYTES = envint("INGEST_MAX_BODY_BYTES", 10 * 1024 * 1024, minimum=1024)
# Records per pushed body (array elements, NDJSON lines): 413 past it. 100,000 of the smallest useful
# records (~100 bytes) fill the body limit; 2-byte lines would be 5 M Python objects per request.
INGEST_MAX_LINES = envint("INGEST_MAX_LINES", 100_000, minimum=1)
# Per ingest token, across every ingest process and pod (outlier_admin.ingest.throttle): at most this
# many requests in progress, and this many body bytes a second (a bucket of INGEST_TOKEN_BURST_BYTES,
# at least one full body); past either, 429 + Retry-After. 0 turns a limit off.
INGEST_TOKEN_CONCURRENCY = envint("INGEST_TOKEN_CONCURRENCY", 2, minimum=0)
INGEST_TOKEN_BYTES_PER_S = envint("INGEST_TOKEN_BYTES_PER_S", 16 * 1024 * 1024, minimum=0)
INGEST_TOKEN_BURST_BYTES = max(envint("INGEST_TOKEN_BURST_BYTES", 2 * INGEST_MAX_BODY_BYTES, minimum=1024),
                               INGEST_MAX_BODY_BYTES)
# Refused input kept: a few samples per reason and batch with their counts, at most this many new
# rows per source (token, log source) and hour (past it, counts only), kept this many days.
INGEST_REJECTED_ROWS_PER_HOUR = envint("INGEST_REJECTED_ROWS_PER_HOUR", 1000, minimum=1)
INGEST_REJECTED_KEEP_DAYS = envint("INGEST_REJECTED_KEEP_DAYS", 30, minimum=1)
# Records with a timestamp further in the future / older than this are rejected records.
INGEST_MAX_FUTURE_S = envint("INGEST_MAX_FUTURE_S", _RECORDS.max_future_s, minimum=0)
INGEST_RETENTION_S = envint("INGEST_RETENTION_S", _RECORDS.retention_s, minimum=60)
# request_id de-duplication window (seconds).
INGEST_DEDUP_WINDOW_S = envint("INGEST_DEDUP_WINDOW_S", 900, minimum=60)
# Detector tick period (ms) and the per-group lock lease (ms). A tick takes ~100 ms and its lease is
# renewed while it runs; a dead worker's lease must lapse well before gateways ignore its groups'
# documents: TICK_LOCK_TTL_MS + 2 x TICK_INTERVAL_MS <= WEIGHTS_STALE_AFTER_S / 2 (control.checks).
TICK_INTERVAL_MS = envint("TICK_INTERVAL_MS", 1000, minimum=100)
TICK_LOCK_TTL_MS = envint("TICK_LOCK_TTL_MS", 5_000, minimum=1000)
# Max stream entries (each holds a batch of records) read per tick.
TICK_MAX_ENTRIES = envint("TICK_MAX_ENTRIES", 500, minimum=1)
# History rows: written on every transition and otherwise at most once per node/signal per this period.
HISTORY_EVERY_S = envint("HISTORY_EVERY_S", 10, minimum=1)
HISTORY_RAW_DAYS = envint("HISTORY_RAW_DAYS", 2, minimum=1)
HISTORY_KEEP_DAYS = envint("HISTORY_KEEP_DAYS", 30, minimum=1)
# Weights documents older than this should be ignored by gateways (they fall back to base weights).
WEIGHTS_STALE_AFTER_S = envint("WEIGHTS_STALE_AFTER_S", DEFAULT_STALE_AFTER_S, minimum=1)
# A gateway whose agent has not reported for this long is shown as gone, not as "behind": a running
# agent reports at least every resync (30 s); one run once (--once) or stopped reports no more.
GATEWAY_GONE_AFTER_S = envint("GATEWAY_GONE_AFTER_S", 300, minimum=1)
CANARY_TIMEOUT_S = envint("CANARY_TIMEOUT_S", 30, minimum=1)
CANARY_MAX_TOKENS = envint("CANARY_MAX_TOKENS", 32, minimum=1)
CANARY_MODEL = envstr("CANARY_MODEL") or ""
# Seconds between the beat's rounds of due canary probes. A benchmark that runs the control plane
# beside a router without applying its weights (bench/drill: the router alone) stretches it so no
# probe adds work to the node under test.
CANARY_INTERVAL_S = envint("CANARY_INTERVAL_S", 1, minimum=1)
DCGM_SCRAPE_INTERVAL_S = envint("DCGM_SCRAPE_INTERVAL_S", 15, minimum=1)
# One exporter's scrape (outlier_admin.ingest.dcgm): the timeout runs from the request to the last byte;
# a page is cut at DCGM_MAX_BYTES (8 GPUs with every DCP field are about 200 KB; the model-server
# pages have METRICS_MAX_BYTES), and a round fetches at most DCGM_MAX_CONNECTIONS exporters at once,
# so it holds at most DCGM_MAX_CONNECTIONS x DCGM_MAX_BYTES of pages whatever the exporters send.
DCGM_TIMEOUT_S = envint("DCGM_TIMEOUT_S", 5, minimum=1)
DCGM_MAX_BYTES = envint("DCGM_MAX_BYTES", 1024 * 1024, minimum=1024)
DCGM_MAX_CONNECTIONS = envint("DCGM_MAX_CONNECTIONS", 64, minimum=1)
# Model-server /metrics scrapes (Node.metrics_url): the streamed decode signal, so scrape often
# (outlier_admin.ingest.scraper: the scrape_metrics service, or one round per beat entry below).
METRICS_SCRAPE_INTERVAL_MS = envint("METRICS_SCRAPE_INTERVAL_MS", 250, minimum=50)
METRICS_TIMEOUT_MS = envint("METRICS_TIMEOUT_MS", 800, minimum=50)  # per request, to the last byte
METRICS_MAX_CONNECTIONS = envint("METRICS_MAX_CONNECTIONS", 1024, minimum=1)  # per scraper process
METRICS_MAX_BYTES = envint("METRICS_MAX_BYTES", 4 * 1024 * 1024, minimum=1024)  # one page
LOG_TAIL_INTERVAL_S = envint("LOG_TAIL_INTERVAL_S", 2, minimum=1)

CELERY_BEAT_SCHEDULE = {
    "tick-all-groups": {"task": "control.tick_all_groups", "schedule": TICK_INTERVAL_MS / 1000.0},
    "canary-probes": {"task": "control.run_due_canaries", "schedule": float(CANARY_INTERVAL_S)},
    # A DCGM round not started within its period is dropped (the next one is due), never queued behind.
    "dcgm-scrape": {"task": "ingest.scrape_all_dcgm", "schedule": float(DCGM_SCRAPE_INTERVAL_S),
                    "options": {"expires": float(DCGM_SCRAPE_INTERVAL_S)}},
    # A round not started within one period is dropped, not run late; it steps aside while a
    # scrape_metrics service runs.
    "metrics-scrape": {"task": "ingest.scrape_all_metrics", "schedule": METRICS_SCRAPE_INTERVAL_MS / 1000.0,
                       "options": {"expires": METRICS_SCRAPE_INTERVAL_MS / 1000.0}},
    "tail-logs": {"task": "ingest.tail_all_logs", "schedule": float(LOG_TAIL_INTERVAL_S)},
    "retention": {"task": "control.retention", "schedule": 3600.0},
    "ingest-retention": {"task": "ingest.retention", "schedule": 3600.0},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "outlier_admin.fleet.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Every endpoint states its own role permission (outlier_admin.api.permissions); reading needs a login.
    "DEFAULT_PERMISSION_CLASSES": ["outlier_admin.api.permissions.CanRead"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": [
        "outlier_admin.api.filters.StrictFilterBackend",  # django-filter's, refusing unknown parameters
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Errors as RFC 9457 problems (application/problem+json), one shape: see outlier_admin.api.errors.
    "EXCEPTION_HANDLER": "drf_standardized_errors.handler.exception_handler",
}
DRF_STANDARDIZED_ERRORS = {
    "EXCEPTION_HANDLER_CLASS": "outlier_admin.api.errors.ProblemHandler",
    "EXCEPTION_FORMATTER_CLASS": "outlier_admin.api.errors.ProblemFormatter",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "outlier-admin API",
    "DESCRIPTION": "Gray-failure control plane: groups, nodes, transitions, proposals, overrides, audit.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["outlier_admin.api.permissions.CanRead"],
    # Swagger UI assets are served from our own static files (no CDN at run time).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # A proposal's source and a silence's cause are one choice set: one enum in the schema.
    "ENUM_NAME_OVERRIDES": {"ProposalSourceEnum": "outlier_admin.control.models.ProposalSource",
                            "OutcomeEnum": "outlier_admin.control.models.Outcome",
                            "IncidentOutcomeEnum": "outlier_admin.control.models.IncidentOutcome"},
    # The enum hook is drf-spectacular's default; ours documents every operation's errors and adds the
    # ingest endpoint (a plain Django view the generator cannot see), its bounds read from the settings.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "outlier_admin.api.schema.postprocess_schema",
    ],
}
LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:overview"
LOGOUT_REDIRECT_URL = "dashboard:login"

# --- Observability (outlier_admin.observability; see README "Observability" / "Alerts") ----------------
from outlier_admin.observability.logconfig import logging_config  # noqa: E402

LOGGING = logging_config(json_logs=envbool("LOG_JSON", True), level=envstr("LOG_LEVEL") or "INFO")
# Static files served by the app itself (gunicorn + whitenoise; no separate web server needed).
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "whitenoise.middleware.WhiteNoiseMiddleware")
WHITENOISE_USE_FINDERS = True
# Alert receivers (comma-separated URLs): Alertmanager API v2 base URLs, receivers of Alertmanager's
# webhook format, generic JSON webhooks.
ALERTMANAGER_URLS = envlist("ALERTMANAGER_URLS", [])
ALERTMANAGER_WEBHOOK_URLS = envlist("ALERTMANAGER_WEBHOOK_URLS", [])
ALERT_WEBHOOK_URLS = envlist("ALERT_WEBHOOK_URLS", [])
METRICS_TOKEN = envstr("METRICS_TOKEN") or ""  # when set, /metrics requires this bearer token
# The Celery worker's own /metrics (observability.worker_metrics; port 0 = off). Loopback unless a
# scraper outside the host needs it; METRICS_TOKEN applies there too.
WORKER_METRICS_PORT = envint("WORKER_METRICS_PORT", 9808, minimum=0)
WORKER_METRICS_BIND = envstr("WORKER_METRICS_BIND") or "127.0.0.1"
# PostgreSQL unreachable: API and dashboard answer 503 + Retry-After (not 500); /metrics keeps serving.
# (Only process_exception matters, so any place works: after clickjacking, leaving axes' last.)
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.clickjacking.XFrameOptionsMiddleware") + 1,
                  "outlier_admin.outage.DatabaseOutageMiddleware")
# Threshold preview bounds (history.preview): over one, the preview is a 400 naming it.
PREVIEW_MAX_WINDOW_S = envint("PREVIEW_MAX_WINDOW_S", 3600, minimum=60)
PREVIEW_MAX_NODES = envint("PREVIEW_MAX_NODES", 1000, minimum=1)
PREVIEW_MAX_ROWS = envint("PREVIEW_MAX_ROWS", 400_000, minimum=1)  # all the reads of one preview together
# How often (history.preview.admit_preview): a token bucket per user (PREVIEW_BURST, one back every
# PREVIEW_REFILL_S seconds) and at most PREVIEW_MAX_CONCURRENT previews at once per web process; over
# either, a 429 with Retry-After.
PREVIEW_BURST = envint("PREVIEW_BURST", 3, minimum=1)
PREVIEW_REFILL_S = envint("PREVIEW_REFILL_S", 20, minimum=1)
PREVIEW_MAX_CONCURRENT = envint("PREVIEW_MAX_CONCURRENT", 1, minimum=1)
ALERT_TIMEOUT_S = envint("ALERT_TIMEOUT_S", 5, minimum=1)
ALERT_RETRIES = envint("ALERT_RETRIES", 2, minimum=0)
# Base URL of the dashboard, for links in alerts (generatorURL).
ALERT_EXTERNAL_URL = envstr("ALERT_EXTERNAL_URL") or ""
EVENT_SCAN_INTERVAL_S = envint("EVENT_SCAN_INTERVAL_S", 5, minimum=1)
# Active alerts are re-sent to Alertmanager this often, each with endsAt = now + 4 x this
# (observability.alerts); the scan runs at least this often so no resend is late.
ALERT_RESEND_S = envint("ALERT_RESEND_S", 60, minimum=1)
CELERY_BEAT_SCHEDULE["scan-events"] = {"task": "observability.scan_events",
                                       "schedule": float(min(EVENT_SCAN_INTERVAL_S, ALERT_RESEND_S))}
