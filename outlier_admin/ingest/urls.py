from django.urls import path

from outlier_admin.ingest import views

urlpatterns = [path("requests", views.ingest_requests, name="ingest-requests")]
