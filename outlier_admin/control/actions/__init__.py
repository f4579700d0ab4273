"""Every state change an operator can make, as one ``do_*`` function each (Zulip's habit).

Each function validates its input (raising :class:`ActionError` or
:class:`detector.thresholds.ThresholdError`, both ``ValueError``), changes the data and writes
one :class:`AuditEvent` in the same database transaction, so there is never a change without its
audit record or an audit record without its change. The API, the dashboard, management commands
and tests all call these; nothing else writes overrides, decisions, thresholds or policies.

``actor`` is either a Django user (recorded as ``user`` and by username) or a string naming a
non-human principal (``"token:ci-bot"``, ``"system:dcgm"``).

Timing: overrides and proposal decisions are stored with ``applied_at = NULL``; the next detector
tick of the group (at most ``TICK_INTERVAL_MS`` later) applies them to the detector state, records
the resulting transition and publishes the weights. Threshold and policy changes are picked up by
the next tick as well.

The actions, by domain: :mod:`.core` (the audit event, the actor, the reason),
:mod:`.overrides`, :mod:`.proposals`, :mod:`.groups`, :mod:`.nodes`, :mod:`.access`. Import them
from here. Ingest's one action (log sources) is :mod:`outlier_admin.ingest.actions`.
"""

from __future__ import annotations

from detector.thresholds import ThresholdError
from outlier_admin.control.actions.access import (
    do_create_token,
    do_create_user,
    do_revoke_token,
    do_set_roles,
    do_unlock_login,
)
from outlier_admin.control.actions.core import REASON_MAX, ActionError, Actor, audit
from outlier_admin.control.actions.groups import (
    GROUP_EDITABLE,
    auto_create_pattern,
    do_create_group,
    do_retire_group,
    do_set_auto_register,
    do_set_group_policy,
    do_update_group,
    do_update_thresholds,
)
from outlier_admin.control.actions.nodes import (
    LABELS_MAX,
    NODE_EDITABLE,
    do_register_node,
    do_register_nodes_from_ingest,
    do_retire_node,
    do_unretire_node,
    do_update_node,
)
from outlier_admin.control.actions.overrides import (
    check_override,
    do_activate,
    do_pin_weight,
    do_quarantine,
    do_release,
    do_unpin_weight,
)
from outlier_admin.control.actions.proposals import (
    DEFAULT_SILENCE_S,
    MAX_SILENCE_S,
    do_approve_proposal,
    do_expire_silence,
    do_propose_quarantine,
    do_reject_proposal,
    do_supersede_proposals,
)

__all__ = [
    "DEFAULT_SILENCE_S",
    "GROUP_EDITABLE",
    "LABELS_MAX",
    "MAX_SILENCE_S",
    "NODE_EDITABLE",
    "REASON_MAX",
    "ActionError",
    "Actor",
    "ThresholdError",
    "audit",
    "auto_create_pattern",
    "check_override",
    "do_activate",
    "do_approve_proposal",
    "do_create_group",
    "do_create_token",
    "do_create_user",
    "do_expire_silence",
    "do_pin_weight",
    "do_propose_quarantine",
    "do_quarantine",
    "do_register_node",
    "do_register_nodes_from_ingest",
    "do_reject_proposal",
    "do_release",
    "do_retire_group",
    "do_retire_node",
    "do_revoke_token",
    "do_set_auto_register",
    "do_set_group_policy",
    "do_set_roles",
    "do_supersede_proposals",
    "do_unlock_login",
    "do_unpin_weight",
    "do_unretire_node",
    "do_update_group",
    "do_update_node",
    "do_update_thresholds",
]
