from django.urls import path

from outlier_admin.observability import views

urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
]
