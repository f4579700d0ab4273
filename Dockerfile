# One image for every service of docker-compose.yml (web, worker, beat, demo) and of the Helm chart.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=outlier_admin.settings \
    PROMETHEUS_MULTIPROC_DIR=/run/prometheus \
    PORT=8000 \
    OA_TRACES_DIR=/app/data/traces

WORKDIR /app
# A fixed uid/gid (999): the Helm chart's runAsUser/fsGroup name the same numbers.
RUN groupadd --system --gid 999 app && useradd --system --uid 999 --gid app --home /app app

# Dependencies first (cached while only the code changes): the exact versions and hashes of
# requirements.lock (`make lock`), so every build of a commit runs the same packages.
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock

COPY . .
# --no-deps: everything the package needs is already installed from the lock. The extras [sim] and
# [demo] are not in the image: the compose demo service uses the redis service, not fakeredis.
RUN pip install --no-deps . \
    && SECRET_KEY=build-only ALLOWED_HOSTS=build-only python manage.py collectstatic --noinput \
    && mkdir -p /run/prometheus && chown app:app /run/prometheus

USER app
EXPOSE 8000 9808
# The default command is the web server: Docker marks the container unhealthy when /healthz stops
# answering (liveness only; readiness, /readyz, also needs PostgreSQL and Redis, which a restart does
# not fix). The Host header is the first of ALLOWED_HOSTS, which Django checks even on /healthz.
# docker-compose.yml and the Helm chart give worker and beat their own checks.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=4 \
    CMD ["python", "-c", "import os, urllib.request as u; h = os.environ.get('ALLOWED_HOSTS', '').split(',')[0].strip().lstrip('.*') or 'localhost'; u.urlopen(u.Request('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8000'), headers={'Host': h}), timeout=4)"]
# The default command is gunicorn alone: fine on loopback, but slow clients hold its threads (issue 29),
# so docker-compose.yml and the Helm chart put nginx (deploy/nginx/nginx.conf) in front of it and
# publish only nginx. WEB_BIND (default 0.0.0.0) sets the address gunicorn listens on.
# Multi-process metrics files belong to the processes of this container run: start clean.
ENTRYPOINT ["/bin/sh", "-c", "rm -rf \"$PROMETHEUS_MULTIPROC_DIR\"/* 2>/dev/null; exec \"$@\"", "--"]
CMD ["gunicorn", "-c", "python:outlier_admin.observability.gunicorn_conf", "outlier_admin.wsgi:application"]
