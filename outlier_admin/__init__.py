"""outlier-admin: the Django control plane around the pure `detector` library."""

from outlier_admin.celery import app as celery_app

__all__ = ["celery_app"]
