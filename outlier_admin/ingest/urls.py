from django.urls import path

from outlier_admin.ingest import views

# Both spellings, one view: every other API path ends in "/" (with it this one answered the API's
# 404), and gateways and agents are configured with the bare one, which stays the documented name.
urlpatterns = [
    path("requests", views.ingest_requests, name="ingest-requests"),
    path("requests/", views.ingest_requests, name="ingest-requests-slash"),
]
