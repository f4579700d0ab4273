"""Users per role and a small fleet, shared with the API tests."""

from tests.outlier_admin.api.conftest import _fast_password_hasher, fleet, make_user, users  # noqa: F401
