from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/ingest/", include("outlier_admin.ingest.urls")),
    path("", include("outlier_admin.observability.urls")),
    path("", include("outlier_admin.api.urls")),
    path("", include("outlier_admin.dashboard.urls")),
]
