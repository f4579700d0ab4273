"""The per-node columns are declared once (NodeArrays' annotations) and FIELDS, the slots, a new node,
a reset and a snapshot all follow that one declaration."""

import math
import typing

import numpy as np

from detector.nodes import FIELDS, Column, NodeArrays


def test_fields_are_the_annotated_columns_in_order():
    hints = typing.get_type_hints(NodeArrays, include_extras=True)
    assert list(FIELDS) == list(hints)
    assert len(FIELDS) == 56
    for name, hint in hints.items():
        assert typing.get_origin(hint) is typing.Annotated, name
        assert typing.get_args(hint)[0] is np.ndarray, name
        (meta,) = hint.__metadata__
        assert isinstance(meta, Column), name
        assert FIELDS[name] == (meta.dtype, meta.fill) or math.isnan(meta.fill)
    assert set(NodeArrays.__slots__) == {"ids", "index", *FIELDS}


def test_every_column_starts_at_its_declared_dtype_and_value():
    nodes = NodeArrays(["a"])
    nodes.append("b")
    for name, (dtype, fill) in FIELDS.items():
        column = nodes.column(name)
        assert column.dtype == np.dtype(dtype), name
        assert column.shape == (2,), name
        if math.isnan(fill):
            assert np.isnan(column).all(), name
        else:
            assert (column == fill).all(), name
    assert FIELDS["state"] == (np.int8, 0)
    assert math.isnan(FIELDS["last_seen"][1]) and FIELDS["last_seen"][0] is np.float64


def test_reset_and_restore_use_the_declared_initial_values():
    nodes = NodeArrays(["a", "b"])
    nodes.evidence[1] = 3.5
    nodes.cut_at[1] = 12.0
    nodes.reset(1, ["evidence", "cut_at"])
    assert nodes.evidence[1] == 0 and math.isnan(nodes.cut_at[1])

    nodes.passes[0] = 4
    columns = {k: v for k, v in nodes.columns().items() if k != "flaps"}  # an older snapshot
    restored = NodeArrays.restore(["a", "b"], {**columns, "gone": np.zeros(2)})
    assert restored.passes.tolist() == [4, 0]
    assert restored.flaps.dtype == np.int64 and restored.flaps.tolist() == [0, 0]
    assert not hasattr(restored, "gone")
