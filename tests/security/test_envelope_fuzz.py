"""Arbitrary bytes on the wire never crash the decoder: they are PoisonMessage or valid."""

from __future__ import annotations

import json
import re
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from jobcore.kernel.envelope import PRINTABLE_TEXT, JobMessage, decode
from jobcore.kernel.errors import PoisonMessage

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _decode_or_poison(body: bytes) -> JobMessage | None:
    try:
        return decode(body)
    except PoisonMessage:
        return None


@given(st.binary(max_size=2048))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_decode_or_are_poison(body: bytes) -> None:
    _decode_or_poison(body)


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_arbitrary_json_decodes_or_is_poison(value: object) -> None:
    _decode_or_poison(json.dumps(value).encode())


@given(
    st.fixed_dictionaries(
        {
            "v": st.just(1),
            "job_id": st.uuids().map(str),
            "attempt": st.integers(1, 1000),
            "type": st.text(min_size=1, max_size=40),
        },
        optional={"extra": json_values},
    )
)
@settings(max_examples=200, deadline=None)
def test_near_valid_envelopes(raw: dict[str, object]) -> None:
    message = _decode_or_poison(json.dumps(raw).encode())
    if "extra" in raw:
        assert message is None  # unknown fields are refused, not ignored
    elif not re.fullmatch(PRINTABLE_TEXT, str(raw["type"])):
        assert message is None  # a type PostgreSQL could not take (NUL, control characters)
    else:
        assert message is not None
        assert message.job_id == uuid.UUID(str(raw["job_id"]))
