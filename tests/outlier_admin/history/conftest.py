from tests.outlier_admin.api.conftest import _fast_password_hasher, fleet, users  # noqa: F401
