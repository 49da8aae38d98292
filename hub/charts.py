"""Line charts for the console, drawn as SVG on the server.

Why SVG from the server, not a charting library in the browser: the console
needs no JavaScript today and keeps it that way (nothing to vendor, pin or
audit, no CDN, nothing fetched at run time), a page is complete as it arrives
(fast, printable, readable by tests and screen readers: each chart carries a
title and a text description of its newest values), and the charts scale with
the page through `viewBox`. What the console charts (a few series of a few
hundred points) needs nothing a library adds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH, HEIGHT = 480, 210
LEFT, RIGHT, TOP, BOTTOM = 58, 10, 10, 46
MAX_POINTS = 240  # points drawn per series: more cannot be told apart at this width


@dataclass(frozen=True)
class Series:
    """One line: its name in the legend, its CSS class (colour), its (unix seconds, value) points."""

    name: str
    css: str
    points: Sequence[tuple[float, float]]


def thin(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most `limit` points, evenly taken, the newest always kept."""
    if len(points) <= limit:
        return list(points)
    step = len(points) / limit
    taken = [points[int(i * step)] for i in range(limit - 1)]
    return [*taken, points[-1]]


def _steps(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """A report's figures hold until the next report: drawn as steps, not slopes between reports."""
    out: list[tuple[float, float]] = []
    for t, v in points:
        if out:
            out.append((t, out[-1][1]))
        out.append((t, v))
    return out


def _number(value: float, unit: str) -> str:
    text = f"{value:,.2f}" if unit == "$" and value != int(value) else f"{value:,.0f}"
    return f"${text}" if unit == "$" else text


def _clock(ts: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(ts))


def line_chart(chart_id: str, title: str, series: Sequence[Series], unit: str = "",
               until: float | None = None) -> Markup:
    """An accessible SVG line chart (role img, title, description of the newest values), or a note when empty.
    `until` (now): each series' newest value is drawn on to it, as it holds until the next report."""
    drawn = [Series(s.name, s.css, thin(s.points)) for s in series if s.points]
    if until is not None:
        drawn = [Series(s.name, s.css, [*s.points, (until, s.points[-1][1])]) if until > s.points[-1][0] else s
                 for s in drawn]
    if not drawn:
        return Markup('<p class="empty">No reports yet: the chart starts with the optimizer\'s first summary.</p>')
    times = [t for s in drawn for t, _ in s.points]
    values = [v for s in drawn for _, v in s.points]
    t0, t1 = min(times), max(times)
    top = max(max(values), 1.0) * 1.1
    span = max(t1 - t0, 1.0)

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * (WIDTH - LEFT - RIGHT)

    def y(v: float) -> float:
        return TOP + (1 - v / top) * (HEIGHT - TOP - BOTTOM)

    newest = "; ".join(f"{s.name} {_number(s.points[-1][1], unit)}" for s in drawn)
    desc = f"From {_clock(t0)} to {_clock(t1)} UTC. Now: {newest}."
    parts = [f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-labelledby="{escape(chart_id)}-t {escape(chart_id)}-d" preserveAspectRatio="xMidYMid meet">',
             f'<title id="{escape(chart_id)}-t">{escape(title)}</title>',
             f'<desc id="{escape(chart_id)}-d">{escape(desc)}</desc>']
    for fraction in (0.0, 0.5, 1.0):
        value = top / 1.1 * fraction
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
                     f'{escape(_number(value, unit))}</text>')
    base = HEIGHT - BOTTOM + 16
    parts.append(f'<text class="axis" x="{LEFT}" y="{base}">{escape(_clock(t0))}</text>')
    parts.append(f'<text class="axis" x="{WIDTH - RIGHT}" y="{base}" text-anchor="end">{escape(_clock(t1))}</text>')
    for n, s in enumerate(drawn):
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in _steps(s.points))
        parts.append(f'<polyline class="line {escape(s.css)}" points="{path}"/>')
        px, py = x(s.points[-1][0]), y(s.points[-1][1])
        parts.append(f'<circle class="dot {escape(s.css)}" cx="{px:.1f}" cy="{py:.1f}" r="3"/>')
        legend_x = LEFT + n * 140
        parts.append(f'<rect class="key {escape(s.css)}" x="{legend_x}" y="{HEIGHT - 13}" width="14" height="5"/>')
        parts.append(f'<text class="legend" x="{legend_x + 19}" y="{HEIGHT - 6}">{escape(s.name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
