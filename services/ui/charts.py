"""Inline SVG sparklines: a polyline scaled to its own maximum, no script and no library."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH = 120
HEIGHT = 24


def sparkline(values: Sequence[float], *, label: str, css_class: str = "spark") -> Markup:
    """``values`` (oldest first) as a small line chart; the last value is marked."""
    if not values:
        return Markup("")
    top = max(max(values), 1)
    step = WIDTH / max(len(values) - 1, 1)
    points = [(i * step, HEIGHT - 2 - (v / top) * (HEIGHT - 4)) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    last_x, last_y = points[-1]
    return Markup(
        '<svg class="{cls}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{label}"><title>{label}</title>'
        '<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{path}"/>'
        '<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="currentColor"/></svg>'
    ).format(cls=css_class, w=WIDTH, h=HEIGHT, label=escape(label), path=path, x=last_x, y=last_y)
