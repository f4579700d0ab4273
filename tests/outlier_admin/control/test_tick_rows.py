"""One writer of a tick's rows (``control.rows.write_rows``, used by the SQL store and the outage
drain) and one function that raises ``ModelGroup.weights_version`` (``publish.record_version``, whose
UPDATE the PostgreSQL statement embeds): the stored version is never lowered, on either path."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import outlier_admin
from outlier_admin.control.rows import TickRows, write_rows
from outlier_admin.fleet.models import ModelGroup

PACKAGE = Path(outlier_admin.__file__).parent
OWNER = PACKAGE / "control" / "publish.py"
#: A write of the stored version: an update() naming it, or SQL raising it.
VERSION_WRITE = re.compile(r"update\([^)]*\bweights_version\b|GREATEST\(\s*weights_version", re.I)


def test_only_publish_raises_the_stored_version():
    writers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if p != OWNER and "migrations" not in p.parts and VERSION_WRITE.search(p.read_text()))
    assert writers == []


@pytest.mark.django_db
@pytest.mark.parametrize("vendor_path", ["postgresql", "orm"])
def test_the_writer_raises_the_version_never_lowers_it_and_sets_the_fields(make_group, vendor_path, monkeypatch):
    if vendor_path == "orm":  # the demo's SQLite path, on this database
        from django.db import connection

        monkeypatch.setattr(type(connection), "vendor", "sqlite", raising=False)
    group = make_group("rows-g")
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    assert write_rows(group, 7, TickRows(), last_tick_at=stamp) == []
    stored = ModelGroup.objects.get(pk=group.pk)
    assert (stored.weights_version, stored.last_tick_at, group.weights_version) == (7, stamp, 7)
    write_rows(group, 5, TickRows())
    assert ModelGroup.objects.get(pk=group.pk).weights_version == 7 and group.weights_version == 7
