"""The benchmark scripts' plot helpers (``scripts/plots.py``) on small synthetic figures: each
writes a valid SVG (its title, axis labels, legend and subtitle in the text) or PNG; the
scripts' own drawing code turns their results into those plots; and without ``--plot`` no
script imports matplotlib.  No benchmark runs here."""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import plots  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def svg_text(path: Path) -> str:
    """Every piece of text in an SVG, one per line (parsing it proves it is valid XML)."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return "\n".join("".join(el.itertext()) for el in root.iter(f"{SVG}text"))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_latency_cdf_names_its_series_percentiles_axes_and_parameters(tmp_path: Path) -> None:
    fast = [float(v) for v in range(1, 101)]  # p50 = 50, p99 = 99 (nearest rank)
    slow = [2 * v for v in fast]
    path = plots.latency_cdf(
        tmp_path / "cdf.svg",
        {"sync": fast, "async": slow},
        title="Latency of both ways",
        params="100 solves each; sandbox at once",
        unit="ms",
        counted="solves",
        log_x=True,
        marks=(50, 99),
    )
    text = svg_text(path)
    for expected in (
        "Latency of both ways",
        "100 solves each; sandbox at once",
        "latency (ms, log scale)",
        "solves at or below (%)",
        "sync (n=100): p50 50.0 · p99 99.0 ms",
        "async (n=100): p50 100 · p99 198 ms",
        "p50",
        "p99",
    ):
        assert expected in text, expected
    assert path.stat().st_size < 100_000, "an SVG plot stays small"


def test_the_cdf_marks_use_the_percentile_it_is_given(tmp_path: Path) -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    path = plots.latency_cdf(
        tmp_path / "cdf.svg",
        {"x": values},
        title="t",
        params="p",
        marks=(50,),
        percentile=lambda v, q: sum(v) / len(v),  # the table's own definition, whatever it is
    )
    assert "p50 2.50 s" in svg_text(path)


def test_a_timeline_counts_results_per_second_and_labels_its_events(tmp_path: Path) -> None:
    path = plots.timeline(
        tmp_path / "timeline.svg",
        {"main": [0.1, 0.2, 1.5, 9.0], "backup": [4.0, 4.5]},
        title="The primary dies",
        params="600 captchas, 15 threads",
        events=[
            plots.Marker(3.0, "primary killed"),
            plots.Marker(6.0, "back"),
            plots.Marker(7.0, "failover", until_s=8.0),
        ],
        counted="solved",
    )
    text = svg_text(path)
    for expected in (
        "The primary dies",
        "600 captchas, 15 threads",
        "solved per second",
        "time since the start (s)",
        "main (4)",
        "backup (2)",
        "primary killed",
        "back",
        "failover",
    ):
        assert expected in text, expected


def test_a_cumulative_timeline_says_so_on_its_axis(tmp_path: Path) -> None:
    path = plots.timeline(
        tmp_path / "cumulative.svg",
        {"ours": [0.5, 1.0, 2.0], "peer": [1.0, 3.0]},
        title="Results so far",
        params="p",
        events=[plots.Marker(2.5, "ideal 2.5 s")],
        cumulative=True,
        xlabel="time since the batch started (s)",
    )
    text = svg_text(path)
    assert "results so far" in text
    assert "time since the batch started (s)" in text
    assert "ideal 2.5 s" in text


def test_results_fall_into_the_second_they_came_in() -> None:
    edges = [0.0, 1.0, 2.0, 3.0]
    assert plots._histogram([0.0, 0.99, 1.0, 2.5, 2.99], edges) == [2, 1, 2]


def test_grouped_bars_show_each_metric_with_its_unit_and_values(tmp_path: Path) -> None:
    path = plots.bars(
        tmp_path / "bars.svg",
        [
            plots.Metric("task messages per captcha", "messages", {"ours": 2.01, "peer": 3.5}),
            plots.Metric("worker CPU per captcha", "ms", {"ours": 8.14, "peer": 12.3}),
            plots.Metric("wall time", "s", {"ours": 6.2, "peer": 9.0}),
        ],
        title="Ours against the peer",
        params="1,000 captchas",
    )
    text = svg_text(path)
    for expected in (
        "Ours against the peer",
        "1,000 captchas",
        "task messages per captcha",
        "worker CPU per captcha",
        "wall time",
        "messages",
        "ms",
        "ours",
        "peer",
        "2.01",
        "3.50",
        "8.14",
        "12.3",
    ):
        assert expected in text, expected


def test_a_png_is_written_when_asked_for_at_a_readable_size(tmp_path: Path) -> None:
    path = plots.latency_cdf(tmp_path / "cdf.png", {"x": [1.0, 2.0, 3.0]}, title="t", params="p")
    width, height = png_size(path)
    assert (width, height) == (
        round(plots.SIZE[0] * plots.PNG_DPI),
        round(plots.SIZE[1] * plots.PNG_DPI),
    )


def test_the_same_figures_make_the_same_file(tmp_path: Path) -> None:
    def draw(name: str) -> bytes:
        series = {"a": [0.5, 1.5, 2.5]}
        return plots.timeline(tmp_path / name, series, title="t", params="p").read_bytes()

    assert draw("one.svg") == draw("two.svg")  # committed images change only with the data


@pytest.mark.parametrize(
    ("name", "series", "error"),
    [
        ("plot.pdf", {"a": [1.0]}, "a plot is written as .svg or .png, not 'plot.pdf'"),
        ("plot.svg", {}, "nothing to plot in plot.svg: no series"),
        ("plot.svg", {"a": []}, "series 'a' has no values"),
    ],
)
def test_bad_input_is_named(tmp_path: Path, name: str, series: dict[str, list[float]], error: str):
    with pytest.raises(ValueError) as raised:
        plots.latency_cdf(tmp_path / name, series, title="t", params="p")
    assert str(raised.value) == error


def test_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [plots.nearest_rank(values, q) for q in (0, 20, 21, 50, 99, 100)] == [
        1.0,
        1.0,
        2.0,
        3.0,
        5.0,
        5.0,
    ]


def test_the_options_put_the_plot_in_the_directory_in_the_format_asked(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    plots.add_options(parser)
    assert parser.parse_args([]).plot is None
    args = parser.parse_args(["--plot", str(tmp_path / "img"), "--plot-format", "png"])
    assert plots.target(args, "core-latency") == tmp_path / "img" / "core-latency.png"
    assert (tmp_path / "img").is_dir()
    assert plots.target(parser.parse_args(["--plot", str(tmp_path)]), "x").suffix == ".svg"


# -- the scripts' drawing code on synthetic results -------------------------------------------


def plot_args(tmp_path: Path, **more: object) -> argparse.Namespace:
    return argparse.Namespace(
        plot=tmp_path, plot_format="svg", machine="1 Dec 2026, 2 cores, load 0.3", **more
    )


def test_bench_failover_draws_results_per_second_with_the_event(tmp_path: Path) -> None:
    import bench_failover

    from harness.sentinel_deployment import BatchRun

    run = BatchRun(started=100.0, ended=130.0)
    run.lines = [{"status": "solved"}] * 5 + [{"status": "failed"}]
    run.arrived = [101.0, 102.0, 103.0, 115.0, 116.0, 117.0]
    run.events = [("kill", 104.0, 106.3)]
    row = bench_failover.Row("kill", 30.0, 2.3, 11.0, 11.0, 5, 1, 0, 0, 0.0, 1.0, 3.0, run=run)
    bench_failover.plot(plot_args(tmp_path, count=6), row)
    text = svg_text(tmp_path / "failover-kill.svg")
    for expected in (
        "A batch through a kill -9 of the master: results per second",
        "kill -9 of the master: new master in 2.3 s",
        "results back for good (+11.0 s)",
        "solved (5)",
        "failed (1)",
        "6 captchas, the event at 2 solved",
        "1 Dec 2026, 2 cores, load 0.3",
    ):
        assert expected in text, expected


def test_bench_pipeline_draws_ours_against_the_peer(tmp_path: Path) -> None:
    import bench_pipeline

    def run(name: str, messages: int, cpu_s: float) -> bench_pipeline.Run:
        return bench_pipeline.Run(name, 10, 10, 0, 6.0, cpu_s, {"t": messages}, 12, 10, 50.0)

    runs = [run("captcha-tasks", 21, 0.081), run("plain submit | poll", 35, 0.123)]
    args = plot_args(tmp_path, count=10, threads=200, warmup=0)
    bench_pipeline.plot(args, runs)
    text = svg_text(tmp_path / "pipeline-cost.svg")
    for expected in ("captcha-tasks", "plain submit | poll", "2.10", "3.50", "8.10", "12.3"):
        assert expected in text, expected


def test_bench_providers_counts_solved_by_provider_and_failures_apart() -> None:
    import bench_providers

    arrivals = bench_providers.Arrivals(Path("unused"))
    arrivals.lines = [
        {"status": "solved", "provider": "main"},
        {"status": "solved", "provider": "backup"},
        {"status": "failed"},
        {"status": "solved", "provider": "main"},
    ]
    arrivals.times = [11.0, 12.0, 13.0, 14.0]
    assert bench_providers.by_provider(arrivals, 10.0) == {
        "main": [1.0, 4.0],
        "backup": [2.0],
        "failed": [3.0],
    }


def test_a_shares_plot_draws_each_series_with_its_target(tmp_path: Path) -> None:
    path = plots.shares(
        tmp_path / "shares.svg",
        {"at the backup": [(20, 0.0), (40, 0.5), (60, 0.9)], "accepted": [(20, 0.4), (60, 0.95)]},
        title="A site moves",
        params="60 captchas",
        targets={"at the backup": 0.8},
        ylabel="share of the last 50",
    )
    text = svg_text(path)
    for expected in (
        "A site moves",
        "60 captchas",
        "at the backup (target 80%)",
        "accepted",
        "share of the last 50",
        "captchas so far",
        "100%",
    ):
        assert expected in text, expected


def test_bench_providers_draws_the_acceptance_run_over_its_rounds(tmp_path: Path) -> None:
    import bench_providers

    from harness.acceptance import BAD_SITE, GOOD_SITE, Measurement, Use

    uses = []
    for number in range(1, 5):  # the bad site moves to the backup from round 3
        provider = "backup" if number >= 3 else "main"
        uses += [Use(number, GOOD_SITE, "main", True), Use(number, BAD_SITE, provider, number > 1)]
    moved = bench_providers.acceptance_shares(uses, BAD_SITE, lambda u: u.provider == "backup")
    assert moved == [(2, 0.0), (4, 0.0), (6, 1 / 3), (8, 0.5)]
    bench_providers.plot_acceptance(plot_args(tmp_path), Measurement(uses))
    text = svg_text(tmp_path / "providers-acceptance.svg")
    for expected in ("bad site: at the backup (target 80%)", "good site: at the primary"):
        assert expected in text, expected


def test_without_plot_no_script_imports_matplotlib() -> None:
    names = ["bench_core", "bench_aio", "bench_batch", "bench_pipeline", "bench_providers"]
    names += ["bench_failover", "bench_pools"]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        f"for name in {names!r}: __import__(name)\n"
        "import plots\n"
        "assert 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if 'matplot' in m)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(SCRIPTS)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
