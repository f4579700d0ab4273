"""outlier-admin: the Django control plane around the pure `detector` library."""

# The Celery app is loaded with Django (so `celery -A outlier_admin` and shared_task work), but a
# gateway host runs `python -m agent` with only redis-py installed: no Celery there.
try:
    from outlier_admin.celery import app as celery_app
except ImportError:  # pragma: no cover - exercised on gateway hosts
    celery_app = None

__all__ = ["celery_app"]
