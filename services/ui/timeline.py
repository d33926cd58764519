"""The job page's timeline section.

PLACEHOLDER until the job timeline (``job_events``, ``job_timeline(db, job_id)``) is
merged: for now it lists the moments the job's row records. The lead wires the timeline
use case in here at merge: this function is the only place the section is rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from markupsafe import Markup, escape

# The row's moments, in the order a job lives through them.
ROW_MOMENTS = (
    ("created_at", "enqueued"),
    ("started_at", "started"),
    ("cancel_requested_at", "cancel requested"),
    ("next_attempt_at", "next attempt due"),
    ("lease_expires_at", "lease ends"),
    ("finished_at", "finished"),
    ("updated_at", "last changed"),
)


def render_timeline(job: Mapping[str, Any]) -> Markup:
    """The job's history as an ordered list (for now: the row's own timestamps)."""
    moments = sorted(
        ((job[column], what) for column, what in ROW_MOMENTS if job.get(column) is not None),
        key=lambda moment: moment[0],
    )
    items = [
        Markup('<li><time datetime="{iso}">{iso}</time> {what}</li>').format(
            iso=at.isoformat(), what=what
        )
        for at, what in moments
    ]
    where = escape(str(job.get("status", "")))
    return Markup(
        "<!-- placeholder: the row's own timestamps until job_timeline is wired in -->"
        '<section id="timeline" aria-labelledby="timeline-h">'
        '<h2 id="timeline-h">Timeline</h2>'
        '<p class="where">Now: <strong>{where}</strong></p>'
        '<ol class="timeline">{items}</ol></section>'
    ).format(where=where, items=Markup("").join(items))
