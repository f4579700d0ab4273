from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from outlier_admin.api import views
from outlier_admin.api.rejected import RejectedInputViewSet
from outlier_admin.api.silences import SilenceViewSet

router = DefaultRouter()
router.register("groups", views.GroupViewSet, basename="group")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("transitions", views.TransitionViewSet, basename="transition")
router.register("incidents", views.IncidentViewSet, basename="incident")
router.register("proposals", views.ProposalViewSet, basename="proposal")
router.register("overrides", views.OverrideViewSet, basename="override")
router.register("probes", views.ProbeViewSet, basename="probe")
router.register("gpu-readings", views.GpuReadingViewSet, basename="gpu-reading")
router.register("audit", views.AuditViewSet, basename="audit")
router.register("rejected-input", RejectedInputViewSet, basename="rejected-input")
router.register("silences", SilenceViewSet, basename="silence")

urlpatterns = [
    path("api/v1/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # Last: any other /api/.../ path is the API's JSON 404. Only paths ending in "/": a path missing
    # its trailing slash must stay unmatched, so that APPEND_SLASH still redirects it to its endpoint.
    re_path(r"^api/(?P<unmatched>[\s\S]*/)$", views.api_not_found, name="api-not-found"),
]
