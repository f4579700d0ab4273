"""drf-spectacular extension: document ``Authorization: Bearer <token>`` for the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "outlier_admin.fleet.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `manage.py create_token --scope api --name N --user USERNAME`. "
            "It acts as that user, with that user's role.",
        }
