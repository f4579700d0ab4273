import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


CHROMIUM = "/usr/bin/chromium"


@contextlib.contextmanager
def chromium_page(*extra_args: str) -> Iterator[Any]:
    """A page of Debian's headless Chromium driven by Playwright (skips when either is missing)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (scripts/ensure-system-packages.sh)")
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test body are
    # still plain synchronous calls, so Django's async-safety guard must be told so.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                               *extra_args])
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            pg = ctx.new_page()
            pg.set_default_timeout(10_000)
            yield pg
            ctx.close()
            browser.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


SHOTS = Path(__file__).resolve().parents[2] / "reports" / "screenshots"


@pytest.fixture
def page():
    """A Chromium page (screenshots go to ``reports/screenshots``)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium_page() as pg:
        yield pg


def recreate_roles() -> None:
    """An earlier transactional test (any directory) flushes the database, the migrated roles
    included: browser tests recreate them before making their users."""
    from django.contrib.auth.models import Group

    for role in ("viewer", "operator", "oncall"):
        Group.objects.get_or_create(name=role)

