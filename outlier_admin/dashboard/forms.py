"""Dashboard forms. Ranges come from :meth:`detector.Thresholds.field_ranges`; the rules themselves
are enforced by the action functions (their errors are shown next to the field)."""

from __future__ import annotations

from typing import Any

from django import forms

from detector.thresholds import Thresholds
from outlier_admin.api.preview import PREVIEW_FIELDS
from outlier_admin.fleet.models import Policy

INTEGER_FIELDS = {"quarantine_persistence", "tail_windows"}


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason (recorded in the audit log)", max_length=2000,
        widget=forms.TextInput(attrs={"size": 60, "autocomplete": "off"}),
    )


class ProposalDecisionForm(ReasonForm):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")], widget=forms.HiddenInput)


class OverrideForm(ReasonForm):
    ACTIONS = [
        ("quarantine", "Quarantine (weight 0)"),
        ("release", "Release (back to service through warm-up)"),
        ("pin", "Pin weight"),
        ("unpin", "Unpin weight"),
        ("activate", "Force active (never quarantine)"),
    ]
    action = forms.ChoiceField(choices=ACTIONS, label="Action")
    weight = forms.IntegerField(label="Weight (pin only, 0 .. 10 x base)", required=False, min_value=0)
    expires_in_s = forms.FloatField(
        label="Expires after (seconds, optional; quarantine, pin, force active)", required=False, min_value=1,
    )
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("action") == "pin" and data.get("weight") is None:
            self.add_error("weight", "Give the weight to pin.")
        return data


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
                label=name.replace("_", " "), required=False,
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
