"""REST API (``/api/v1/``) for automation and the dashboard's live parts; OpenAPI at ``/api/schema/``."""
