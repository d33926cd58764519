"""Naming rules for Prometheus metrics: the lint rules of ``promtool check metrics``, read
from Prometheus's ``util/promlint``, plus the rule promtool cannot see: a name says its unit.

The text is parsed with prometheus_client's own parser, so what is checked is what a
scrape reads. promtool's rules: a help text; ``_total`` on counters; ``_bucket``,
``_count`` and ``_sum`` only on histograms (and summaries); ``le`` / ``quantile`` labels
only there; no type in the name; no ``:`` (reserved for recording rules); snake_case
metric and label names; base units (``seconds``, ``bytes``), not ``milliseconds`` or
``minutes``; no abbreviated units (``ms``, ``s``, ``kb``). Ours: a quantity with a unit
ends with it (``_seconds``, ``_bytes``, then ``_total`` on a counter), and no name ends
with a word that hides which unit it is in (``_size``, ``_latency``, ``_age`` ...).
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
SNAKE_CASE = re.compile(r"^[a-z_][a-z0-9_]*$")
TYPES_IN_NAMES = ("counter", "gauge", "histogram", "summary")
BASE_UNITS = ("seconds", "bytes", "meters", "volts", "amperes", "celsius", "grams", "joules")
UNIT_PREFIXES = (
    "pico",
    "nano",
    "micro",
    "milli",
    "centi",
    "deci",
    "deca",
    "hecto",
    "kilo",
    "kibi",
    "mega",
    "mebi",
    "giga",
    "gibi",
    "tera",
    "tebi",
    "peta",
    "pebi",
)
NON_BASE_TIME = ("minutes", "hours", "days", "weeks")
ABBREVIATED_UNITS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")
# Words that name a quantity without its unit: the value could be seconds or
# milliseconds, bytes or rows.
UNITLESS_QUANTITIES = (
    "size",
    "length",
    "latency",
    "duration",
    "time",
    "age",
    "delay",
    "lag",
    "elapsed",
    "timeout",
    "interval",
    "memory",
)


def lint(text: str) -> list[str]:
    """Every naming problem in a Prometheus text exposition, one line each."""
    # The parser names a counter family without its _total, and adds _total to samples
    # that lack it: the counter rule reads the TYPE lines as written.
    problems = [
        f'{name}: counter metrics should have "_total" suffix'
        for name, kind in TYPE_LINE.findall(text)
        if kind == "counter" and not name.endswith("_total")
    ]
    for family in text_string_to_metric_families(text):
        name, kind = family.name, family.type
        if name.endswith("_created") and kind == "gauge":
            # The creation time prometheus_client exposes beside a counter or histogram.
            continue
        problems.extend(f"{name}: {p}" for p in _family_problems(name, kind, family.documentation))
        for sample in family.samples:
            for label in sample.labels:
                if not SNAKE_CASE.match(label):
                    problems.append(f"{sample.name}: label {label!r} is not snake_case")
                if label == "le" and kind != "histogram":
                    problems.append(f'{sample.name}: "le" label outside a histogram')
                if label == "quantile" and kind != "summary":
                    problems.append(f'{sample.name}: "quantile" label outside a summary')
    return sorted(set(problems))


def _family_problems(name: str, kind: str, help_text: str) -> list[str]:
    problems: list[str] = []
    if not help_text.strip():
        problems.append("no help text")
    if ":" in name:
        problems.append('metric names should not contain ":"')
    if not SNAKE_CASE.match(name):
        problems.append("metric names should be written in snake_case")
    if kind not in ("histogram", "gaugehistogram") and name.endswith("_bucket"):
        problems.append('non-histogram metrics should not have "_bucket" suffix')
    if kind not in ("histogram", "summary") and name.endswith(("_count", "_sum")):
        problems.append('non-histogram and non-summary metrics should not have "_count" / "_sum"')
    words = name.split("_")
    for typename in TYPES_IN_NAMES:
        if typename in words:
            problems.append(f'metric name should not include type "{typename}"')
    for word in words:
        if word in NON_BASE_TIME:
            problems.append(f'use base unit "seconds" instead of "{word}"')
        for unit in BASE_UNITS:
            if word != unit and word.endswith(unit) and word.removesuffix(unit) in UNIT_PREFIXES:
                problems.append(f'use base unit "{unit}" instead of "{word}"')
        if word in ABBREVIATED_UNITS:
            problems.append(f'metric names should not contain abbreviated units ("{word}")')
    # The unit, when there is one, ends the name (a counter's _total is not in the
    # family name prometheus_client parses).
    stem = words[:-1] if words[-1] == "total" else words
    for unit in BASE_UNITS:
        if unit in stem[:-1]:
            problems.append(f'the unit "{unit}" should end the name')
    if stem[-1] in UNITLESS_QUANTITIES:
        problems.append(
            f'"{stem[-1]}" says no unit: end with one (_seconds, _bytes) or the thing counted'
        )
    return problems
