"""The publisher's hand-written content header and body frames are byte for byte what
pamqp marshals, and it leaves every other shape of message to pamqp."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.frame import marshal as marshal_frame
from pamqp.header import ContentHeader

from jobcore.amqp.publisher import (
    ENVELOPE_HEADER,
    PERSISTENT,
    OutgoingMessage,
    _body_frame,
    _header_frame,
)
from jobcore.kernel.envelope import CONTENT_TYPE, ENVELOPE_VERSION

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def pamqp_header(message: OutgoingMessage, channel: int) -> bytes:
    properties = Basic.Properties(
        content_type=CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        message_id=message.message_id,
        message_type=message.message_type,
        headers={**message.headers, ENVELOPE_HEADER: ENVELOPE_VERSION},
    )
    return marshal_frame(ContentHeader(properties=properties, body_size=len(message.body)), channel)


def message(headers: dict[str, object], message_id: str = "m-1", message_type: str = "noop",
            body: bytes = b'{"v":1}') -> OutgoingMessage:  # fmt: skip
    return OutgoingMessage("jobs", "default", message_id, message_type, headers, body)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.dictionaries(
        st.text(min_size=1, max_size=60).filter(lambda k: k != ENVELOPE_HEADER),
        st.text(max_size=300),
        max_size=4,
    ),
    message_id=st.text(min_size=1, max_size=60),
    message_type=st.text(min_size=1, max_size=60),
    body=st.binary(max_size=200),
    channel=st.integers(min_value=1, max_value=65535),
)
def test_the_header_frame_is_pamqps(
    headers: dict[str, str], message_id: str, message_type: str, body: bytes, channel: int
) -> None:
    try:
        m = message(dict(headers), message_id, message_type, body)
        expected = pamqp_header(m, channel)
    except (UnicodeEncodeError, TypeError):
        return  # pamqp refuses it (a lone surrogate, a key it truncates): not the fast path's
    if any(len(k.encode()) > 128 for k in headers) or len(message_id.encode()) > 255:
        assert _header_frame(m, channel) is None
        return
    if len(message_type.encode()) > 255:
        assert _header_frame(m, channel) is None
        return
    assert _header_frame(m, channel) == expected


def test_a_trace_context_message_takes_the_fast_path_and_matches() -> None:
    m = message({"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    frame = _header_frame(m, 7)
    assert frame is not None
    assert frame == pamqp_header(m, 7)


def test_shapes_it_does_not_write_are_left_to_pamqp() -> None:
    shapes: tuple[dict[str, object], ...] = (
        {"n": 1},  # a non-string value
        {ENVELOPE_HEADER: "2"},  # the envelope header given by the row
        {"k" * 129: "v"},  # a key pamqp truncates
    )
    for headers in shapes:
        assert _header_frame(message(headers), 1) is None
    assert _header_frame(message({}, message_id=""), 1) is None  # pamqp omits an empty id
    assert _header_frame(message({}, message_type="t" * 256), 1) is None


@given(body=st.binary(min_size=1, max_size=500), channel=st.integers(min_value=1, max_value=65535))
def test_the_body_frame_is_pamqps(body: bytes, channel: int) -> None:
    assert _body_frame(body, channel) == marshal_frame(ContentBody(body), channel)
