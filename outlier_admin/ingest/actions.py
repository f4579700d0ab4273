"""Ingest's action: the log sources tailed by ``manage.py tail_logs``.

An action as those of :mod:`outlier_admin.control.actions` (its docstring states the rules every
action keeps), kept beside the model it writes so that the control plane imports nothing of ingest."""

from __future__ import annotations

import re
from typing import Any

from django.db import transaction

from outlier_admin.control.actions.core import ActionError, Actor, _reason, audit
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.ingest.models import IngestSource


def do_save_log_source(name: str, *, path: str, log_format: str, group: ModelGroup | None,
                       node_map: dict[str, str], actor: Actor, reason: str) -> Any:
    """Create or update the log source ``name`` (``manage.py tail_logs --add``) and enable it; one audit
    event ``ingest_source.create`` or ``ingest_source.update`` (with the diff) in the same transaction."""
    reason = _reason(reason)
    name = (name or "").strip()
    if not re.fullmatch(r"[-a-zA-Z0-9_]{1,100}", name):
        raise ActionError(f"a log source name is 1-100 letters, digits, '-' or '_', got {name[:100]!r}")
    if not isinstance(path, str) or not path.strip():
        raise ActionError("a log source needs a path")
    fields = {"kind": "log", "location": path.strip(), "log_format": log_format, "default_group": group,
              "enabled": True, "node_map": node_map}
    with transaction.atomic():
        row = IngestSource.objects.select_for_update().filter(name=name).first()
        if row is None:
            row = IngestSource.objects.create(name=name, **fields)
            audit("ingest_source.create", actor, group=group, reason=reason,
                  detail={"source": name, "path": row.location, "format": log_format, "node_map": node_map})
            return row
        def shown(obj: Any) -> dict[str, Any]:  # comparable, JSON-able values of the fields
            return {k: (v.name if isinstance(v, ModelGroup) else v) for k, v in obj.items()}

        old = shown({k: getattr(row, k) for k in fields})
        new = shown(fields)
        diff = {k: [old[k], new[k]] for k in fields if old[k] != new[k]}
        for key, value in fields.items():
            setattr(row, key, value)
        row.save(update_fields=list(fields))
        audit("ingest_source.update", actor, group=group, reason=reason, detail={"source": name, "diff": diff})
    return row
