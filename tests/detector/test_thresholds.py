import pytest

from detector.thresholds import ThresholdError, Thresholds


def test_defaults_are_the_seeds():
    t = Thresholds()
    assert (t.ema_alpha, t.degrade_z, t.quarantine_z, t.quarantine_persistence) == (0.15, 2.0, 3.5, 10)
    assert (t.window_size, t.tail_min_samples, t.tail_ratio, t.tail_windows, t.tail_window_s) == (1000, 100, 3.0, 3, 30.0)
    assert t.max_quarantine_fraction == 0.30
    assert (t.consecutive_errors, t.success_rate_stdev, t.success_rate_min_hosts) == (5, 1.9, 5)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("ema_alpha", 0.0, "ema_alpha: must be in (0, 1]"),
        ("ema_alpha", 1.5, "ema_alpha"),
        ("seed_prompt_weight", -0.1, "seed_prompt_weight: must be in [0, 1]"),
        ("max_quarantine_fraction", 1.2, "max_quarantine_fraction"),
        ("quarantine_persistence", 2.5, "must be an integer"),
        ("quarantine_z", 1.0, "must be greater than degrade_z"),
        ("window_size", "big", "must be a number"),
        ("degrade_z", float("nan"), "degrade_z"),
        ("recovery_steps", [0.5, 0.25, 1.0], "recovery_steps"),
        ("normalization", "magic", "normalization"),
    ],
)
def test_invalid_values_are_refused_with_the_field_and_range(field, value, fragment):
    with pytest.raises(ThresholdError) as err:
        Thresholds().replace(**{field: value})
    assert err.value.field == field
    assert fragment in str(err.value)


def test_unknown_key_is_refused():
    with pytest.raises(ThresholdError, match="quarantine_zz: unknown threshold"):
        Thresholds.from_dict({"quarantine_zz": 4})


def test_round_trip_through_dict():
    t = Thresholds().replace(quarantine_z=4.0, recovery_steps=[0.1, 0.5, 1.0], require_approval=True)
    assert Thresholds.from_dict(t.to_dict()) == t
    assert t.recovery_steps == (0.1, 0.5, 1.0)


def test_field_ranges_describe_every_numeric_field():
    ranges = Thresholds.field_ranges()
    assert ranges["ema_alpha"] == "(0, 1]"
    assert ranges["quarantine_persistence"].startswith("integer [1,")


def test_the_detectors_constants_are_stated_once_in_thresholds():
    """Issue 25: every number in one place, with its reason. The constants that lived in ejection,
    signals, group and tail are module constants of detector.thresholds, each under a comment, and no
    other detector module assigns one."""
    import re
    from pathlib import Path

    import detector.thresholds as th

    names = ("MAX_FLAP_DOUBLINGS", "STRONG_CUT_SAMPLES", "TAIL_PEER_FACTOR", "BATCH_EXTRAPOLATION",
             "LATENCY_ONLY_CLIP", "REFERENCE_SD", "ROWS_FRESH_S", "POOL_OBSERVATION_S", "POOL_MAX_STEPS",
             "EXIT_MATERIALITY_FRACTION", "WEIGHT_HALVING_Z", "COMPARABLE_LOAD_FRACTION", "PREFILL_STALL_S")
    root = Path(th.__file__).parent
    source = (root / "thresholds.py").read_text()
    for name in names:
        assert isinstance(getattr(th, name), int | float), name
        assert re.search(rf"#: [^\n]+\n(#:[^\n]*\n)*{name} = ", source), f"{name} has no reason above it"
        for f in root.rglob("*.py"):
            if f.name != "thresholds.py":
                assert not re.search(rf"^{name}\s*=", f.read_text(), re.M), f"{name} assigned in {f}"
