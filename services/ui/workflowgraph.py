"""A workflow's graph as inline SVG, drawn on the server: its jobs in columns (each one
column right of its furthest dependency, `finally` jobs last), an arrow per edge, each job
coloured by its state and linked to its page. No script, no download."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from jobcore.usecases.workflows import graph_levels

NODE_W = 150
NODE_H = 40
GAP_X = 60
GAP_Y = 18
PAD = 10
# Fill and stroke per state (the console's status colours).
COLOURS = {
    "succeeded": ("#e6f4ea", "#1e7e34"),
    "failed": ("#fdecee", "#c5221f"),
    "running": ("#e8f0fe", "#1a56db"),
    "cancelled": ("#eeeeee", "#777777"),
    "pending": ("#ffffff", "#555555"),
    "waiting": ("#fff8e1", "#9a6700"),
}
# How an edge is drawn per policy (on_success: a solid line).
DASHES = {"on_success": "", "on_complete": "6 3", "on_failure": "2 3"}


def state_of(job: Mapping[str, Any]) -> str:
    """pending, waiting (for its dependencies), running, succeeded, failed or cancelled."""
    if job["status"] == "pending" and job.get("held_reason") == "dependencies":
        return "waiting"
    return str(job["status"])


def workflow_svg(jobs: Sequence[Mapping[str, Any]], *, base: str) -> str:
    """The graph of ``jobs`` (as :func:`jobcore.usecases.workflows.get_workflow` lists
    them) as an ``<svg>`` element; each job links to ``{base}/jobs/{id}``."""
    columns = graph_levels(jobs)
    by_name = {job["name"]: job for job in jobs}
    place: dict[str, tuple[int, int]] = {}
    for x, column in enumerate(columns):
        for y, name in enumerate(column):
            place[name] = (PAD + x * (NODE_W + GAP_X), PAD + y * (NODE_H + GAP_Y))
    width = PAD * 2 + max(1, len(columns)) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max((len(c) for c in columns), default=1) * (NODE_H + GAP_Y) - GAP_Y
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="workflow-graph" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-label="The workflow\'s jobs and their dependencies">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#888"/></marker></defs>',
    ]
    for job in jobs:
        tx, ty = place[job["name"]]
        for edge in job["depends_on"]:
            fx, fy = place[edge["name"]]
            dash = DASHES.get(edge["policy"], "")
            dashed = f' stroke-dasharray="{dash}"' if dash else ""
            parts.append(
                f'<line class="edge {escape(edge["policy"])}" x1="{fx + NODE_W}" '
                f'y1="{fy + NODE_H // 2}" x2="{tx}" y2="{ty + NODE_H // 2}" stroke="#888" '
                f'stroke-width="1.5"{dashed} '
                f'marker-end="url(#arrow)"><title>{escape(edge["name"])} → '
                f"{escape(job['name'])}: {escape(edge['policy'])} ({escape(edge['state'])})"
                "</title></line>"
            )
    for name, (x, y) in place.items():
        job = by_name[name]
        state = state_of(job)
        fill, stroke = COLOURS.get(state, COLOURS["pending"])
        label = name if len(name) <= 18 else name[:17] + "…"
        parts.append(
            f'<a href="{escape(base)}/jobs/{job["id"]}"><g class="node {state}" '
            f'data-name="{escape(name)}"><title>{escape(name)}: {state}'
            f"{' (finally)' if job.get('is_finally') else ''}</title>"
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{2 if job.get("is_finally") else 1.2}"/>'
            f'<text x="{x + 8}" y="{y + 16}" font-size="12" fill="#111">{escape(label)}</text>'
            f'<text x="{x + 8}" y="{y + 31}" font-size="11" fill="{stroke}">{state}</text></g></a>'
        )
    parts.append("</svg>")
    return "".join(parts)
