"""The Grafana dashboard drawn from its own panels and queries, on a real Prometheus, with matplotlib.

Grafana itself cannot be installed where the fleet tests run, so the docs' picture of the dashboard
is drawn here instead: every panel of deploy/grafana/maskserve.json at its place on Grafana's
24-column grid, under its row's title, each target run as a range query with the variables filled
as Grafana fills them, each line named by its legendFormat and the y axis in the panel's unit.
What is Grafana's own (its theme, tooltips, variable pickers) is not drawn, and the picture says so.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

from tests.system.deploy.queries import DASHBOARD, dashboard, grafana_expr, panels
from tests.system.fleet.prometheus import Prometheus

COLUMNS = 24  # Grafana's grid
# The figure's width and resolution: wide enough that a panel a third of the grid wide keeps its
# legend on one line, and a PNG small enough to commit.
WIDTH_IN = 15.0
DPI = 100
# A grid unit's height over a column's width: Grafana's proportions on a wide screen, where a panel
# eight units high is about half as high as a third of the grid is wide.
UNIT_ASPECT = 0.5
HEADER_IN = 0.75  # the dashboard's title and what the picture is
PAD_IN = 0.06  # the gap between panels
# The first colours of Grafana's classic palette, so that lines read as the dashboard's would.
PALETTE = ("#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0")
BACKGROUND = "#F4F5F5"
CARD = "#FFFFFF"
BORDER = "#D8D9DA"
TEXT = "#1F1F20"
FAINT = "#6E6E73"
LEGEND_PER_LINE = 3
# The time axis is ticked at whole multiples of one of these (seconds), the smallest that keeps a
# panel to a handful of ticks: round clock times, as Grafana's axis shows.
TICK_SPACINGS_S = (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)
MAX_TICKS = 6
# Under the title, so that the picture says what it is wherever it is seen.
WHAT_IT_IS = (
    f"Not a Grafana screenshot: the panels and queries of deploy/grafana/{DASHBOARD.name}, "
    "drawn with matplotlib from a real Prometheus. Times UTC."
)


@dataclass(frozen=True)
class Target:
    """One query of a panel and the legend its series are named by."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time-series panel as the dashboard places and formats it."""

    row: str
    title: str
    x: int
    y: int
    w: int
    h: int
    unit: str
    targets: tuple[Target, ...]
    fill_opacity: float
    line_width: float
    y_min: float | None
    y_max: float | None
    thresholds: tuple[tuple[float, str], ...]  # (value, colour) of each threshold drawn as a line


@dataclass(frozen=True)
class Row:
    title: str
    y: int


@dataclass(frozen=True)
class Series:
    """One series a target returned over the window; NaN where Prometheus had no number."""

    labels: dict[str, str]
    name: str
    times: tuple[float, ...]
    values: tuple[float, ...]

    @property
    def points(self) -> int:
        """The points a line can be drawn through (a quantile of no requests is NaN)."""
        return sum(1 for value in self.values if math.isfinite(value))


@dataclass(frozen=True)
class PanelData:
    panel: Panel
    series: tuple[Series, ...]


def layout() -> tuple[list[Row], list[Panel]]:
    """The rows and panels of the dashboard, where Grafana puts them. A collapsed row's panels are
    drawn as if it were open (queries.panels): the picture is of everything the dashboard holds."""
    rows = [Row(raw["title"], raw["gridPos"]["y"]) for raw in dashboard()["panels"] if raw["type"] == "row"]
    return rows, [_panel(row, raw) for row, raw in panels()]


def _panel(row: str, raw: dict[str, Any]) -> Panel:
    if raw["type"] != "timeseries":
        raise ValueError(f"{DASHBOARD.name}: {raw['title']!r} is a {raw['type']} panel; only timeseries are drawn")
    defaults = raw.get("fieldConfig", {}).get("defaults", {})
    custom = defaults.get("custom", {})
    style = custom.get("thresholdsStyle", {}).get("mode", "off")
    steps = defaults.get("thresholds", {}).get("steps", []) if style != "off" else []
    grid = raw["gridPos"]
    return Panel(
        row=row,
        title=raw["title"],
        x=grid["x"],
        y=grid["y"],
        w=grid["w"],
        h=grid["h"],
        unit=defaults.get("unit", "none"),
        targets=tuple(Target(t["expr"], t.get("legendFormat", "")) for t in raw["targets"]),
        fill_opacity=custom.get("fillOpacity", 0) / 100,
        line_width=custom.get("lineWidth", 1),
        y_min=defaults.get("min"),
        y_max=defaults.get("max"),
        # The base step (value null) is the colour below the first threshold, not a line.
        thresholds=tuple((s["value"], s["color"]) for s in steps if s["value"] is not None),
    )


def legend(template: str, labels: dict[str, str]) -> str:
    """A series' name as Grafana writes it: legendFormat with ``{{label}}`` filled, or the labels."""
    if template and template != "__auto":
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


async def query_panels(
    prometheus: Prometheus,
    panels: Sequence[Panel],
    *,
    namespace: str,
    rate_interval: str,
    start: float,
    end: float,
    step: float,
) -> list[PanelData]:
    """Every target of every panel as a range query over ``[start, end]`` (Unix times)."""
    drawn: list[PanelData] = []
    for panel in panels:
        series: list[Series] = []
        for target in panel.targets:
            expr = grafana_expr(target.expr, namespace=namespace, rate_interval=rate_interval)
            for found in await prometheus.query_range(expr, start=start, end=end, step=step):
                labels: dict[str, str] = found["metric"]
                points = found["values"]
                series.append(
                    Series(
                        labels,
                        legend(target.legend, labels),
                        tuple(float(t) for t, _ in points),
                        tuple(float(v) for _, v in points),  # Prometheus writes NaN as "NaN"
                    )
                )
        drawn.append(PanelData(panel, tuple(series)))
    return drawn


def _number(value: float) -> str:
    """Three significant digits at most, without trailing zeros: 0.25, 12.5, 3."""
    text = f"{value:.3g}"
    return text if "e" in text else text.rstrip("0").rstrip(".") if "." in text else text


def _scaled(value: float, scales: Sequence[tuple[float, str]]) -> str:
    """``value`` in the largest of ``scales`` (factor, suffix) it reaches, as Grafana scales units."""
    size = abs(value)
    factor, suffix = scales[0]
    for candidate in scales:
        if size >= candidate[0]:
            factor, suffix = candidate
    return f"{_number(value / factor)}{suffix}"


SECONDS = ((1e-6, " µs"), (1e-3, " ms"), (1.0, " s"), (60.0, " min"), (3600.0, " hour"))
SHORT = ((1.0, ""), (1e3, " K"), (1e6, " Mil"), (1e9, " Bil"))


def unit_formatter(unit: str) -> Callable[[float], str]:
    """How Grafana writes a value of ``unit`` on an axis, for the units dashboards here use."""
    if unit == "s":
        return lambda v: "0" if v == 0 else _scaled(v, SECONDS)
    if unit == "ms":
        return lambda v: "0" if v == 0 else _scaled(v / 1e3, SECONDS)
    if unit == "percentunit":
        return lambda v: f"{_number(v * 100)}%"
    if unit == "percent":
        return lambda v: f"{_number(v)}%"
    if unit == "reqps":
        return lambda v: f"{_scaled(v, SHORT)} req/s"
    if unit == "short":
        return lambda v: _scaled(v, SHORT)
    return _number  # "none" and any unit not listed: the plain number


def _with_gaps(series: Series, step: float) -> tuple[list[float], list[float]]:
    """The series' points, with a NaN wherever a step is missing, so that the line breaks there
    as Grafana's does (spanNulls off) instead of joining across the gap."""
    times: list[float] = []
    values: list[float] = []
    for t, v in zip(series.times, series.values):
        if times and t - times[-1] > 1.5 * step:
            times.append(times[-1] + step)
            values.append(math.nan)
        times.append(t)
        values.append(v)
    return times, values


def _clock(t: float, _: object = None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def draw(
    drawn: Sequence[PanelData],
    rows: Sequence[Row],
    path: Path,
    *,
    start: float,
    end: float,
    step: float,
    about: str,
    shaded: tuple[float, float] | None = None,
) -> None:
    """One PNG of every panel at its grid place, each over ``[start, end]``; ``shaded`` (Unix
    times) is drawn behind every panel, for a span that ``about`` (under the title) explains."""
    column = WIDTH_IN / COLUMNS
    unit = column * UNIT_ASPECT
    bottom = max([p.panel.y + p.panel.h for p in drawn] + [r.y + 1 for r in rows])
    height = HEADER_IN + bottom * unit + PAD_IN
    figure = Figure(figsize=(WIDTH_IN, height), dpi=DPI, facecolor=BACKGROUND)
    FigureCanvasAgg(figure)  # Agg draws to a PNG without a display, and the figure is its own

    def box(x: float, top: float, w: float, h: float) -> tuple[float, float, float, float]:
        """Inches from the top left into the figure's fractions (left, bottom, width, height)."""
        return x / WIDTH_IN, 1 - (top + h) / height, w / WIDTH_IN, h / height

    def at(x: float, top: float) -> tuple[float, float]:
        return x / WIDTH_IN, 1 - top / height

    figure.text(*at(PAD_IN * 2, 0.12), dashboard()["title"], fontsize=15, weight="bold", color=TEXT, va="top")
    figure.text(*at(PAD_IN * 2, 0.45), f"{WHAT_IT_IS} {about}", fontsize=8.5, color=FAINT, va="top")
    for row in rows:
        figure.text(
            *at(PAD_IN * 2, HEADER_IN + (row.y + 0.5) * unit),
            row.title,
            fontsize=10.5,
            weight="bold",
            color=TEXT,
            va="center",
        )

    window = (start, end)
    for data in drawn:
        panel = data.panel
        left, top = panel.x * column + PAD_IN, HEADER_IN + panel.y * unit + PAD_IN
        width, tall = panel.w * column - 2 * PAD_IN, panel.h * unit - 2 * PAD_IN
        figure.add_artist(
            Rectangle(
                box(left, top, width, tall)[:2],
                width / WIDTH_IN,
                tall / height,
                transform=figure.transFigure,
                facecolor=CARD,
                edgecolor=BORDER,
                linewidth=0.8,
                zorder=-1,  # under the panel's axes
            )
        )
        figure.text(*at(left + 0.1, top + 0.08), panel.title, fontsize=9, weight="bold", color=TEXT, va="top")
        legend_lines = max(1, math.ceil(len(data.series) / LEGEND_PER_LINE))
        # Room inside the card: the title above, tick labels left and below, the legend under them.
        axes = figure.add_axes(box(left + 0.72, top + 0.36, width - 0.88, tall - 0.36 - 0.3 - 0.17 * legend_lines))
        colours = _plot(axes, data, step, window, shaded)
        handles = [Line2D([], [], color=colour, linewidth=2) for colour in colours]
        figure.legend(
            handles,
            [s.name for s in data.series],
            loc="upper left",
            bbox_to_anchor=at(left + 0.1, top + tall - 0.04 - 0.17 * legend_lines),
            ncol=LEGEND_PER_LINE,
            frameon=False,
            fontsize=7.5,
            handlelength=1.2,
            columnspacing=1.2,
            borderaxespad=0,
            borderpad=0,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, facecolor=BACKGROUND)


def _plot(
    axes: Axes,
    data: PanelData,
    step: float,
    window: tuple[float, float],
    shaded: tuple[float, float] | None,
) -> list[str]:
    """One panel's lines, thresholds and axes; the colour of each series, for the legend."""
    panel = data.panel
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(data.series))]
    for series, colour in zip(data.series, colours):
        times, values = _with_gaps(series, step)
        axes.plot(times, values, color=colour, linewidth=panel.line_width)
        if panel.fill_opacity:
            axes.fill_between(times, values, color=colour, alpha=panel.fill_opacity, linewidth=0)
    for value, colour in panel.thresholds:
        axes.axhline(value, color=colour, linewidth=1, linestyle="--")
    if shaded is not None:
        axes.axvspan(*shaded, color="#5794F2", alpha=0.07, linewidth=0)
    axes.set_xlim(window)
    # Rates, depths and durations never go below zero, so an axis under zero would only make room
    # for nothing: it starts at zero where no value is negative, and a flat zero line (no refusals)
    # gets the range 0 to 1 rather than a band around zero. The panel's own min and max come first.
    finite = [v for series in data.series for v in series.values if math.isfinite(v)]
    low = panel.y_min
    if low is None and finite and min(finite) >= 0:
        low = 0.0
    high = panel.y_max
    if high is None and low == 0 and finite and max(finite) <= 0:
        high = 1.0
    axes.set_ylim(low, high)
    formatter = unit_formatter(panel.unit)
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: formatter(v)))
    # Steps of 1, 2, 2.5 or 5 times a power of ten: three replicas read 0, 1, 2, 3, not 0.8, 1.6, 2.4.
    axes.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
    span = window[1] - window[0]
    spacing = next((s for s in TICK_SPACINGS_S if span / s <= MAX_TICKS), TICK_SPACINGS_S[-1])
    axes.xaxis.set_major_locator(MultipleLocator(spacing))
    axes.xaxis.set_major_formatter(FuncFormatter(_clock))
    axes.tick_params(labelsize=7, colors=FAINT, length=0)
    axes.grid(color=BORDER, linewidth=0.5)
    axes.set_facecolor(CARD)
    for spine in axes.spines.values():
        spine.set_visible(False)
    return colours
