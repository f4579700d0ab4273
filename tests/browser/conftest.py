import pytest
from django.db import connections

from tests.outlier_admin.api.conftest import _fast_password_hasher, fleet, users  # noqa: F401


@pytest.fixture(autouse=True)
def _close_server_connections():
    """The live server's request threads would keep their connections for CONN_MAX_AGE seconds and
    block dropping the test database; close them after every request during browser tests."""
    settings_dict = connections["default"].settings_dict
    old = settings_dict.get("CONN_MAX_AGE", 0)
    settings_dict["CONN_MAX_AGE"] = 0
    yield
    settings_dict["CONN_MAX_AGE"] = old
