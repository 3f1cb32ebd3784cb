"""Plots of the benchmark scripts' figures: latency CDFs, timelines and grouped bars.

The scripts import this module always and matplotlib (the ``bench`` extra) only when they
draw (``--plot DIR``), so they still run without it.  Figures are drawn on a bare
:class:`~matplotlib.figure.Figure` (the Agg canvas, no pyplot state, no display) and written
as SVG with text kept as text (small files, searchable, sharp at any size) unless the path
ends in ``.png``.  Every plot has a title, axis labels with units, a legend and the run's
parameters in a subtitle.

    parser = argparse.ArgumentParser()
    plots.add_options(parser)                         # --plot DIR, --plot-format svg|png
    ...
    if args.plot:
        plots.latency_cdf(plots.target(args, "core-latency"), {"measured": seconds}, ...)
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("svg", "png")
#: Inches; at 100 dpi an SVG is 900 x 500 px, a PNG (150 dpi) 1350 x 750.
SIZE = (9.0, 5.0)
PNG_DPI = 150
#: Stable SVG ids and no date in the file: a plot redrawn from the same figures is the same file.
STYLE: dict[str, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "captcha-tasks",
    "font.size": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f")
MARKER_COLOR = "#444444"

Percentile = Callable[[Sequence[float], float], float]
Draw = TypeVar("Draw", bound=Callable[..., Path])


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``at_s`` labelled ``label``; with ``until_s``, a shaded span."""

    at_s: float
    label: str
    until_s: float | None = None


@dataclass(frozen=True)
class Metric:
    """One panel of grouped bars: ``values`` by series name (ours, the peer), in ``unit``."""

    name: str
    unit: str
    values: Mapping[str, float]


# -- the scripts' options ---------------------------------------------------------------------


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--plot DIR`` and ``--plot-format`` on a benchmark script's parser."""
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="DIR",
        help="also draw plots of the figures into DIR (needs the bench extra's matplotlib)",
    )
    parser.add_argument("--plot-format", choices=FORMATS, default="svg")


def target(args: argparse.Namespace, name: str) -> Path:
    """Where plot ``name`` goes: ``DIR/name.svg`` (or ``.png``), DIR created."""
    directory: Path = args.plot
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{name}.{args.plot_format}"


def machine() -> str:
    """The date, the cores and the load average: say when a figure was measured under load."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    busy = ", under load" if load > cores else ""  # more runnable work than cores
    today = datetime.date.today()
    return f"{today.day} {today:%b %Y}, {cores} cores, load {load:.1f} at the start{busy}"


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The smallest value with at least ``q`` percent of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats' rounding
    return ordered[int(rank) - 1]


def _styled(draw: Draw) -> Draw:
    """Run ``draw`` under :data:`STYLE` (matplotlib reads most settings as it creates each
    artist, so the whole drawing runs inside)."""

    @functools.wraps(draw)
    def styled(*args: Any, **kwargs: Any) -> Path:
        from matplotlib import rc_context

        with rc_context(cast(Any, STYLE)):  # (its stubs list every key: a dict of ours is str)
            return draw(*args, **kwargs)

    return cast(Draw, styled)


# -- the plots --------------------------------------------------------------------------------


@_styled
def latency_cdf(
    path: Path,
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    params: str,
    unit: str = "s",
    quantity: str = "latency",
    counted: str = "requests",
    log_x: bool = False,
    marks: Sequence[float] = (50, 95, 99),
    percentile: Percentile = nearest_rank,
) -> Path:
    """An empirical CDF per series (values in ``unit``), with a dot where each crosses each
    of ``marks`` (percentiles, by ``percentile``: pass the table's own) and the values in
    the legend."""
    _check(path, series)
    fig, (ax,) = _figure(1)
    for n, (name, values) in enumerate(series.items()):
        if not values:
            raise ValueError(f"series {name!r} has no values")
        color = COLORS[n % len(COLORS)]
        at = [percentile(values, q) for q in marks]
        shown = " · ".join(f"p{q:g} {_num(v)}" for q, v in zip(marks, at, strict=True))
        ax.ecdf(list(values), color=color, label=f"{name} (n={len(values)}): {shown} {unit}")
        ax.plot(at, [q / 100 for q in marks], "o", color=color, markersize=4)
    for q in marks:
        ax.axhline(q / 100, color=MARKER_COLOR, linestyle=":", linewidth=0.8)
        ax.annotate(
            f"p{q:g}",
            xy=(1, q / 100),
            xycoords=("axes fraction", "data"),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=MARKER_COLOR,
        )
    if log_x:
        _log_axis(ax)
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(_percent())
    ax.set_xlabel(f"{quantity} ({unit}{', log scale' if log_x else ''})")
    ax.set_ylabel(f"{counted} at or below (%)")
    # under the plot, one series a line: curves of any shape cross any corner of it
    fig.legend(loc="outside lower center", ncols=1)
    return _save(fig, path, title, params)


@_styled
def timeline(
    path: Path,
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    params: str,
    events: Sequence[Marker] = (),
    counted: str = "results",
    bin_s: float = 1.0,
    cumulative: bool = False,
    end_s: float | None = None,
    xlabel: str = "time since the start (s)",
) -> Path:
    """Results over time: ``series`` are the seconds (from the start) at which each result
    came, drawn as stacked results per ``bin_s`` or as cumulative counts, with ``events``
    marked."""
    _check(path, series)
    if bin_s <= 0:
        raise ValueError(f"bin_s must be positive, not {bin_s}")
    last = max((max(v) for v in series.values() if v), default=0.0)
    end = max(end_s or 0.0, last, *(m.until_s or m.at_s for m in events)) + bin_s
    fig, (ax,) = _figure(1)
    if cumulative:
        for n, (name, times) in enumerate(series.items()):
            ordered = sorted(times)
            ax.step(
                [0.0, *ordered, end],
                [0, *range(1, len(ordered) + 1), len(ordered)],
                where="post",
                color=COLORS[n % len(COLORS)],
                label=f"{name} ({len(ordered)})",
            )
        ax.set_ylabel(f"{counted} so far")
    else:
        edges = [i * bin_s for i in range(int(end / bin_s) + 2)]
        below = [0.0] * (len(edges) - 1)
        for n, (name, times) in enumerate(series.items()):
            counts = _histogram(times, edges)
            rate = [b + c / bin_s for b, c in zip(below, counts, strict=True)]
            ax.stairs(
                rate,
                edges,
                baseline=below,
                fill=True,
                alpha=0.75,
                color=COLORS[n % len(COLORS)],
                label=f"{name} ({len(times)})",
            )
            below = rate
        per = "second" if bin_s == 1 else f"{bin_s:g} s"
        ax.set_ylabel(f"{counted} per {per}")
    if cumulative or bin_s == 1:  # counts
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _mark(ax, events, end)
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    if cumulative:  # the curves rise to the right: the upper left stays empty
        ax.legend(loc="upper left")
    else:
        fig.legend(loc="outside lower center", ncols=len(series))
    return _save(fig, path, title, params)


@_styled
def shares(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    params: str,
    targets: Mapping[str, float] | None = None,
    xlabel: str = "captchas so far",
    ylabel: str = "share",
) -> Path:
    """Shares over time: each series' ``(x, share in [0, 1])`` points as a line, and its
    target (``targets[name]``) as a dotted line of the same colour."""
    _check(path, series)
    fig, (ax,) = _figure(1)
    for n, (name, points) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        goal = (targets or {}).get(name)
        label = name if goal is None else f"{name} (target {goal:.0%})"
        ax.plot([x for x, _ in points], [y for _, y in points], color=color, label=label)
        if goal is not None:
            ax.axhline(goal, color=color, linestyle=":", linewidth=1)
    ax.yaxis.set_major_formatter(_percent())
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.legend(loc="outside lower center", ncols=min(2, len(series)))
    return _save(fig, path, title, params)


@_styled
def bars(path: Path, metrics: Sequence[Metric], *, title: str, params: str) -> Path:
    """Grouped bars, one panel per metric (each with its own unit and scale), the same
    colour for a series in every panel, the value written on each bar."""
    if not metrics:
        raise ValueError("no metrics to plot")
    _check(path, metrics[0].values)
    names = list(dict.fromkeys(name for m in metrics for name in m.values))
    fig, axes = _figure(len(metrics))
    for ax, metric in zip(axes, metrics, strict=True):
        shown = [name for name in names if name in metric.values]
        heights = [metric.values[name] for name in shown]
        colors = [COLORS[names.index(name) % len(COLORS)] for name in shown]
        drawn = ax.bar(range(len(shown)), heights, color=colors)
        ax.bar_label(drawn, labels=[_num(h) for h in heights], padding=2, fontsize=9)
        ax.set_title(metric.name, fontsize=10)
        ax.set_ylabel(metric.unit)
        ax.set_xticks(range(len(shown)), [""] * len(shown))
        ax.tick_params(axis="x", length=0)
        ax.grid(axis="x", visible=False)
        ax.margins(y=0.15)
    from matplotlib.patches import Patch

    handles = [Patch(color=COLORS[n % len(COLORS)], label=name) for n, name in enumerate(names)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(names))
    return _save(fig, path, title, params)


# -- the parts they share ---------------------------------------------------------------------


def _check(path: Path, series: Mapping[str, Any]) -> None:
    if path.suffix.lstrip(".") not in FORMATS:
        raise ValueError(f"a plot is written as .svg or .png, not {path.name!r}")
    if not series:
        raise ValueError(f"nothing to plot in {path.name}: no series")


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    width = max(SIZE[0], 2.6 * panels)  # a panel's title stays clear of the next one's
    fig = Figure(figsize=(width, SIZE[1]), layout="constrained")
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def _save(fig: Figure, path: Path, title: str, params: str) -> Path:
    lines = textwrap.wrap(params, 130)
    # The run's parameters under the title.  Constrained layout makes room for the suptitle
    # only: its empty lines (13 pt) hold the subtitle's (8.5 pt), which start below the title.
    fig.suptitle(title + "\n" * len(lines), fontsize=13, fontweight="bold")
    subtitle = "\n\n" + "\n".join(lines)
    fig.text(0.5, 1.0, subtitle, ha="center", va="top", fontsize=8.5, color="#333333")
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix.lstrip(".")
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    fig.savefig(path, format=fmt, dpi=PNG_DPI if fmt == "png" else 100, metadata=metadata)
    return path


def _mark(ax: Axes, events: Sequence[Marker], span: float) -> None:
    """Each event's line, its label to the left of it, or to the right where the previous
    line is too near for two labels side by side."""
    previous: float | None = None
    for marker in sorted(events, key=lambda m: m.at_s):
        ax.axvline(marker.at_s, color=MARKER_COLOR, linestyle="--", linewidth=1)
        if marker.until_s is not None:
            ax.axvspan(marker.at_s, marker.until_s, color=MARKER_COLOR, alpha=0.12, linewidth=0)
        near = previous is not None and marker.at_s - previous < 0.03 * span
        ax.annotate(
            marker.label,
            xy=(marker.at_s, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3 if near else -3, -4),
            textcoords="offset points",
            rotation=90,
            ha="left" if near else "right",
            va="top",
            fontsize=8.5,
            color=MARKER_COLOR,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"},
        )
        previous = marker.at_s


def _log_axis(ax: Axes) -> None:
    """A log x axis read as plain numbers at 1, 2, 3, 5 x 10^n (not as powers of ten)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _histogram(times: Sequence[float], edges: Sequence[float]) -> list[int]:
    counts = [0] * (len(edges) - 1)
    width = edges[1] - edges[0]
    for t in times:
        counts[min(len(counts) - 1, max(0, int(t // width)))] += 1
    return counts


def _percent() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0, decimals=0)


def _num(value: float) -> str:
    """A figure as a table prints it: whole above 100, else one or two decimals."""
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if size >= 0.1 or size == 0 else f"{value:.2g}"
