"""The frame protocol's JSON: json's C encoder and scanner called without the json package."""

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


def test_this_python_runs_the_c_codec_not_the_json_package() -> None:
    assert proto.dumps.__name__ == "lean_dumps"
    assert proto.loads.__name__ == "lean_loads"


@settings(max_examples=400)
@given(JSON_VALUES)
def test_frames_carry_the_bytes_json_writes_and_read_back_what_json_reads(value: Any) -> None:
    text = json.dumps(value, separators=(",", ":"))
    assert proto.dumps(value) == text
    assert same(proto.loads(text), json.loads(text))
    assert same(proto.decode_json(proto.encode_json(proto.REPLY, value)[7:]), value)


@given(JSON_VALUES)
def test_the_json_package_fallback_agrees(value: Any) -> None:
    dumps, loads = proto._json_codec()
    assert dumps(value) == proto.dumps(value)
    assert same(loads(dumps(value)), proto.loads(proto.dumps(value)))


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
        proto.dumps({"a": b"x"})
    with pytest.raises(TypeError):
        json.dumps({"a": b"x"})
