"""The console's server-drawn SVG charts (hub/charts.py), on plain data: what the markup says, and that names
are text. Real: the function the console calls; faked: nothing."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hub.charts import MAX_POINTS, Series, line_chart, thin

SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    return ET.fromstring(str(markup).replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))


def test_a_chart_says_its_title_and_newest_values_in_text() -> None:
    svg = parse(line_chart("c", "GPUs", [Series("Allocated", "s-allocated", [(0.0, 2.0), (60.0, 5.0)]),
                                        Series("Idle <b>", "s-idle", [(0.0, 1.0)])], until=120.0))
    assert svg.get("role") == "img" and svg.get("aria-labelledby") == "c-t c-d"
    assert svg.find(f"{SVG}title").text == "GPUs"  # type: ignore[union-attr]
    assert svg.find(f"{SVG}desc").text == (  # type: ignore[union-attr]
        "From 01-01 00:00 to 01-01 00:02 UTC. Now: Allocated 5; Idle <b> 1.")
    lines = svg.findall(f"{SVG}polyline")
    assert len(lines) == 2
    # steps: a report's figure holds until the next one, and the newest until now
    assert len(lines[0].get("points", "").split()) == 5
    assert [t.text for t in svg.findall(f"{SVG}text") if t.get("class") == "legend"] == ["Allocated", "Idle <b>"]


def test_no_report_is_a_sentence_not_an_empty_chart() -> None:
    assert "No reports yet" in line_chart("c", "Cost", [Series("Cost", "s-cost", [])], "$")


def test_long_histories_are_thinned_keeping_the_newest() -> None:
    points = [(float(t), float(t)) for t in range(5000)]
    kept = thin(points)
    assert len(kept) == MAX_POINTS and kept[0] == points[0] and kept[-1] == points[-1]
