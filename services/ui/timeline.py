"""The job page's timeline section: where the job is now, in words, and every event of
its life, oldest first (``jobcore.usecases.timeline.job_timeline``, the same answer as
``GET /jobs/{id}/timeline`` and ``jobcore jobs timeline``). Details are the events' own
few facts (worker, relay, attempt, next time, error text): never a payload or a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from jobcore.usecases.whereabouts import JobTimeline

# How events read on the page: the kinds' words for people.
KIND_WORDS = {
    "accepted": "accepted",
    "published": "published to the broker",
    "claimed": "started (claimed by a worker)",
    "retry_scheduled": "retry scheduled",
    "released": "given back at shutdown",
    "snoozed": "snoozed by its handler",
    "edited": "changed in place",
    "lease_lost": "lease lost",
    "cancel_requested": "cancel requested",
    "quarantined": "quarantined in the outbox",
    "dead_lettered": "dead-lettered",
    "republished": "published again",
    "cancelled": "cancelled",
    "finished": "finished",
    "webhook_attempt": "webhook attempt",
}


def render_timeline(timeline: JobTimeline | None, *, with_where: bool = True) -> Markup:
    """The section: the ``where`` sentence (unless the page says it already), then the
    events as an ordered list."""
    if timeline is None:
        return Markup('<section id="timeline"><h2>Timeline</h2><p>No such job.</p></section>')
    items = [
        Markup(
            '<li class="event event-{kind}"><time datetime="{iso}">{iso}</time> '
            "<strong>{words}</strong>{attempt}{detail}</li>"
        ).format(
            kind=event.kind,
            iso=event.at.isoformat(),
            words=KIND_WORDS.get(event.kind, event.kind),
            attempt=Markup(" (attempt {n})").format(n=event.attempt)
            if event.attempt is not None
            else "",
            detail=_detail(event.detail),
        )
        for event in timeline.events
    ]
    return Markup(
        '<section id="timeline" aria-labelledby="timeline-h">'
        '<h2 id="timeline-h">Timeline</h2>'
        "{where}{off}"
        '<ol class="timeline">{items}</ol></section>'
    ).format(
        where=Markup('<p class="where">Now: <strong>{where}</strong></p>').format(
            where=timeline.where
        )
        if with_where
        else "",
        off=Markup("")
        if timeline.events_recorded
        else Markup(
            '<p class="note">Events are not being recorded (JOBCORE_JOB_EVENTS=false): '
            "only those written before are listed.</p>"
        ),
        items=Markup("").join(items),
    )


def _detail(detail: Mapping[str, Any]) -> Markup:
    if not detail:
        return Markup("")
    facts = Markup(", ").join(
        Markup("{key}: {value}").format(key=key, value=value) for key, value in detail.items()
    )
    return Markup(' <span class="detail">{facts}</span>').format(facts=facts)
