"""The frame protocol's JSON control frames."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.remote import proto

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None))  # lone surrogates and astral characters too
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(codec=None)), inner, max_size=4)
    ),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=400)
@given(JSON_VALUES)
def test_a_control_frame_carries_compact_json_and_reads_back_what_json_reads(value: Any) -> None:
    text = json.dumps(value, separators=(",", ":"))
    frame = proto.encode_json(proto.REPLY, value)
    assert frame[proto.HEADER.size :] == text.encode("ascii")
    assert same(proto.decode_json(frame[proto.HEADER.size :]), json.loads(text))


@pytest.mark.parametrize(
    "payload", [b"", b"{", b'{"a":1} x', b'{"a":1}{}', b"\xff", b"nul", b'"\\x"']
)
def test_a_payload_that_is_not_json_is_a_frame_error(payload: bytes) -> None:
    with pytest.raises(proto.FrameError, match="not JSON"):
        proto.decode_json(payload)
    with pytest.raises(ValueError):
        json.loads(payload)  # json refuses each of them too


def test_what_json_cannot_write_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(TypeError, match="Object of type bytes is not JSON serializable"):
        proto.encode_json(proto.REPLY, {"a": b"x"})
    with pytest.raises(TypeError):
        json.dumps({"a": b"x"})
