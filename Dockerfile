# One image for every service of docker-compose.yml (web, worker, beat, demo).
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
RUN groupadd --system app && useradd --system --gid app --home /app app

# Dependencies first (cached while only the code changes).
COPY pyproject.toml README.md ./
COPY detector/__init__.py detector/__init__.py
COPY outlier_admin/__init__.py outlier_admin/__init__.py
RUN pip install .

COPY . .
RUN pip install --no-deps . \
    && SECRET_KEY=build-only ALLOWED_HOSTS=build-only python manage.py collectstatic --noinput \
    && mkdir -p /run/prometheus && chown app:app /run/prometheus

USER app
EXPOSE 8000 9808
# Multi-process metrics files belong to the processes of this container run: start clean.
ENTRYPOINT ["/bin/sh", "-c", "rm -rf \"$PROMETHEUS_MULTIPROC_DIR\"/* 2>/dev/null; exec \"$@\"", "--"]
CMD ["gunicorn", "-c", "python:outlier_admin.observability.gunicorn_conf", "outlier_admin.wsgi:application"]
