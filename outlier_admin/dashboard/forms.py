"""Dashboard forms. Ranges come from :meth:`detector.Thresholds.field_ranges`; the rules themselves
are enforced by the action functions (their errors are shown next to the field)."""

from __future__ import annotations

from typing import Any

from django import forms

from detector.thresholds import Thresholds
from outlier_admin.control.actions import REASON_MAX, ActionError, check_override
from outlier_admin.fleet.models import Node, Policy
from outlier_admin.history.preview import PREVIEW_FIELDS

INTEGER_FIELDS = {"quarantine_persistence", "tail_windows"}


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason (recorded in the audit log)", max_length=REASON_MAX,
        widget=forms.TextInput(attrs={"size": 60, "autocomplete": "off"}),
    )


class ProposalDecisionForm(ReasonForm):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")], widget=forms.HiddenInput)
    # A rejection silences new proposals of the node and cause for this long (actions.do_reject_proposal).
    silence_s = forms.TypedChoiceField(
        label="After a rejection, no new proposal for", coerce=int, required=False, initial=3600,
        choices=[(900, "15 minutes"), (3600, "1 hour"), (4 * 3600, "4 hours"), (86400, "1 day"),
                 (7 * 86400, "7 days")], empty_value=None,
    )


class OverrideForm(ReasonForm):
    ACTIONS = [
        ("quarantine", "Quarantine (weight 0)"),
        ("release", "Release (back to service at full weight; judged afresh by the detector)"),
        ("pin", "Pin weight"),
        ("unpin", "Unpin weight"),
        ("activate", "Force active (never quarantine)"),
    ]
    action = forms.ChoiceField(choices=ACTIONS, label="Action")
    weight = forms.IntegerField(label="Weight (pin only, 0 .. base weight)", required=False, min_value=0)
    expires_in_s = forms.FloatField(
        label="Expires after (seconds, optional; quarantine, pin, force active)", required=False, min_value=1,
    )
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, node: Node | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.node = node

    def clean(self) -> dict[str, Any]:
        """The action's own rules (:func:`~outlier_admin.control.actions.check_override`: the pin's
        range, the expiry's bound), checked here so the confirmation page only restates an action
        that will be accepted."""
        data = super().clean()
        if data.get("action") == "pin" and data.get("weight") is None:
            self.add_error("weight", "Give the weight to pin.")
        elif self.node is not None and data.get("action") and data.get("reason") and not self.errors:
            try:
                check_override(self.node, data["action"], reason=data["reason"],
                               expires_in_s=data.get("expires_in_s"), weight=data.get("weight"))
            except ActionError as exc:
                field = "weight" if "weight" in str(exc) else "expires_in_s" if "expires" in str(exc) else None
                self.add_error(field, str(exc))
        return data


class RetireForm(ReasonForm):
    """Retiring a node: a reason, and a confirmation that restates what happens."""

    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)


#: Labels that a field's name alone leaves ambiguous (``quarantine_persistence`` and
#: ``quarantine_persistence_s`` both read "quarantine persistence" otherwise).
LABELS = {"quarantine_persistence": "quarantine persistence (samples; seed mode, or seconds set to 0)"}


def threshold_label(name: str) -> str:
    """A threshold's name in words, with its unit where the name carries one (``_s``: seconds)."""
    if name in LABELS:
        return LABELS[name]
    if name.endswith("_s"):
        return f"{name[:-2].replace('_', ' ')} (seconds)"
    return name.replace("_", " ")


class ThresholdForm(ReasonForm):
    """One field per threshold the preview can replay; blank keeps the current value."""

    def __init__(self, *args: Any, current: Thresholds, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ranges = Thresholds.field_ranges()
        values = current.to_dict()
        self.fields["reason"].required = False  # required to save, not to preview (checked in the view)
        for name in PREVIEW_FIELDS:
            field_cls = forms.IntegerField if name in INTEGER_FIELDS else forms.FloatField
            self.fields[name] = field_cls(
                label=threshold_label(name), required=False,
                help_text=f"allowed {ranges[name]}; current {values[name]}",
                widget=forms.NumberInput(attrs={"step": "any", "placeholder": str(values[name])}),
            )
        self.current = values

    def changes(self) -> dict[str, Any]:
        """Fields given and different from the current values."""
        return {
            name: self.cleaned_data[name]
            for name in PREVIEW_FIELDS
            if self.cleaned_data.get(name) is not None and self.cleaned_data[name] != self.current[name]
        }


class PolicyForm(ReasonForm):
    policy = forms.ChoiceField(choices=Policy.choices, label="Policy")
