from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers and tools ask for /favicon.ico whatever the page says: a redirect, not a 404 warning
    # logged on every page view.
    path("favicon.ico", RedirectView.as_view(url=static("dashboard/favicon.svg"), permanent=True)),
    path("api/v1/ingest/", include("outlier_admin.ingest.urls")),
    path("", include("outlier_admin.observability.urls")),
    path("", include("outlier_admin.api.urls")),
    path("", include("outlier_admin.dashboard.urls")),
]
