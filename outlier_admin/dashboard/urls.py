from django.contrib.auth import views as auth_views
from django.urls import path

from outlier_admin.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("groups/<slug:slug>/", views.group_page, name="group"),
    path("groups/<slug:slug>/thresholds/", views.thresholds_page, name="thresholds"),
    path("groups/<slug:slug>/policy/", views.group_policy, name="policy"),
    path("nodes/<int:pk>/", views.node_page, name="node"),
    path("nodes/<int:pk>/override/", views.node_override, name="override"),
    path("nodes/<int:pk>/retire/", views.node_retire, name="retire"),
    path("approvals/", views.approvals, name="approvals"),
    path("approvals/<int:pk>/decide/", views.decide_proposal, name="decide"),
    path("silences/<int:pk>/expire/", views.expire_silence, name="expire_silence"),
    path("canary/", views.canary_review, name="canary"),
    path("audit/", views.audit_log, name="audit"),
    path("audit/export.csv", views.audit_csv, name="audit_csv"),
    path("transitions/export.csv", views.transitions_csv, name="transitions_csv"),
    path("rejected/", views.rejected_input, name="rejected"),
    # Throttled by django-axes (outlier_admin.fleet.login_throttle): its backend refuses a locked-out
    # attempt and its middleware answers 429 + Retry-After with this page.
    path("accounts/lockouts/", views.login_lockouts, name="lockouts"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]

