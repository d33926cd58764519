"""A running job's progress (``await ctx.progress(fraction, message)``): its bounds and how
often it is written.

A leaf module (it imports nothing of jobcore's, so the API and the worker load no schema
with it): the handler context and the worker's writer share these numbers, and the
schema's check constraint on ``jobs`` repeats the longest message (a unit test keeps the
two equal).
"""

from __future__ import annotations

import math

# The longest progress message, in characters (a check constraint on jobs too).
PROGRESS_MESSAGE_MAX_CHARS = 500

# A job's progress is written at most once per this many seconds: the latest report wins,
# and what is pending when the handler ends is written before its outcome.
PROGRESS_FLUSH_INTERVAL = 0.25


def checked_progress(fraction: float, message: str | None) -> tuple[float, str | None]:
    """``fraction`` and ``message`` as they will be stored; ValueError when out of bounds
    (a fraction outside [0, 1] or not a number, a message too long or that PostgreSQL text
    cannot hold)."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"progress fraction must be a number in [0, 1], not {fraction!r}")
    value = float(fraction)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"progress fraction must be in [0, 1], not {fraction!r}")
    if message is None:
        return value, None
    if not isinstance(message, str):
        raise ValueError("a progress message must be a string")
    if len(message) > PROGRESS_MESSAGE_MAX_CHARS:
        raise ValueError(
            f"a progress message is at most {PROGRESS_MESSAGE_MAX_CHARS} characters, "
            f"not {len(message)}"
        )
    if "\x00" in message:
        raise ValueError("a progress message cannot contain NUL characters (PostgreSQL text)")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a progress message must be encodable as UTF-8") from None
    return value, message
