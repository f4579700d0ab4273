from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "outlier_admin.ingest"
    label = "ingest"
    verbose_name = "Ingest: request records, gateway logs, DCGM readings, rejected input"
