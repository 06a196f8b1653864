"""The HTML report (``corral.sim.report_html``): ``corral compare --out`` writes ``report.html``, every plot as a
valid PNG, ``comparison.csv`` and ``comparison.json`` agreeing with each policy's ``summary.json``; ``corral
report`` re-makes the same plots from the folders; the page is self-contained (nothing fetched) and loads in
Chromium without an error; without matplotlib the report keeps its tables and says how to get the plots.

The plot tests need matplotlib (the ``report`` extra); the browser test needs Playwright and a Chromium
executable (``.ci/run`` installs both). Each is skipped with its reason when missing."""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from browser import chromium
from corral.cli.main import cli
from corral.sim.metrics import SUMMARY_KEYS
from corral.sim.report_html import INSTALL_HINT, PLOT_FILES, find_runs, render_report
from corral.workloads.data import data_file

SIXTY = str(data_file("tiresias", "60_job.csv"))
REPLAY = ["--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4", "--no-progress"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Plots of every replay; the quota and the AntMan plots only where there are quotas and opportunistic jobs.
ALWAYS = ("jct_cdf.png", "queueing_cdf.png", "queue_length.png", "utilization.png", "rho_cdf.png")

needs_matplotlib = pytest.mark.skipif(
    find_spec("matplotlib") is None, reason=f"the plots need matplotlib: {INSTALL_HINT}"
)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`corral compare --out` with fifo and srtf on the Tiresias 60-job trace, on 2x4."""
    out = tmp_path_factory.mktemp("cmp") / "out"
    code, text = invoke("compare", *REPLAY, "--policy", "fifo", "--policy", "srtf", "--out", str(out))
    assert code == 0, text
    return out


def _check_png(path: Path) -> None:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC), path
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, (path, pixels.shape)


def _resource_urls(page: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", page, flags=re.IGNORECASE)


@needs_matplotlib
def test_compare_writes_every_plot_as_a_valid_png(compared: Path) -> None:
    for name in ALWAYS:
        _check_png(compared / name)
    for name in set(PLOT_FILES) - set(ALWAYS):
        assert not (compared / name).exists(), f"{name}: no quotas nor opportunistic jobs in this replay"
    page = (compared / "report.html").read_text()
    assert page.count('<img src="data:image/png;base64,') == len(ALWAYS)
    for metric in SUMMARY_KEYS:
        assert f"<td>{metric}</td>" in page
    assert "<th>fifo</th>" in page and "<th>srtf</th>" in page


@needs_matplotlib
def test_quotas_and_opportunistic_jobs_add_their_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, text = invoke(
        "compare", *REPLAY, "--assign-tenants", "3", "--quotas", "equal:0.8", "--opportunistic", "0.3",
        "--policy", "fifo", "--policy", "antman", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text
    for name in PLOT_FILES:
        _check_png(out / name)
    assert (out / "report.html").read_text().count("data:image/png;base64,") == len(PLOT_FILES)


def test_comparison_files_agree_with_each_summary(compared: Path) -> None:
    rows = json.loads((compared / "comparison.json").read_text())
    assert [(r["policy_spec"], r["folder"]) for r in rows] == [("fifo", "fifo"), ("srtf", "srtf")]
    with (compared / "comparison.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["policy_spec"] for r in table] == ["fifo", "srtf"]
    for row, line in zip(rows, table, strict=True):
        summary: dict[str, Any] = json.loads((compared / row["folder"] / "summary.json").read_text())
        assert {k: v for k, v in row.items() if k not in ("policy_spec", "folder")} == summary
        for key in SUMMARY_KEYS:
            assert float(line[key]) == summary[key], key
        assert line["policy"] == summary["policy"] and "trace_notes" not in line


@needs_matplotlib
def test_report_rerenders_the_same_plots(compared: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    code, text = invoke("report", str(compared), "--out", str(again))
    assert code == 0, text
    for name in ALWAYS:
        assert (again / name).read_bytes() == (compared / name).read_bytes(), name
    assert (again / "report.html").read_text() == (compared / "report.html").read_text()
    # One policy's folder (a simulate folder) in place, and two folders side by side (before/after).
    single = tmp_path / "fifo"
    shutil.copytree(compared / "fifo", single)
    code, text = invoke("report", str(single))
    assert code == 0, text
    for name in ALWAYS:
        _check_png(single / name)
    code, text = invoke("report", str(compared), str(single))
    assert code != 0 and "--out" in text, text
    both = tmp_path / "both"
    code, text = invoke("report", str(compared), str(single), "--out", str(both))
    assert code == 0, text
    labels = [run.label for run in find_runs([compared, single])]
    assert labels[:2] == ["out/fifo", "out/srtf"] and labels[2].startswith("fifo: fifo(")  # folder: policy
    page = (both / "report.html").read_text()
    assert "<th>out/srtf</th>" in page


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "not a corral output folder: no summary.json"),
        (lambda d: (d / "summary.json").write_text("{}"), "missing"),
        (lambda d: (d / "x").mkdir(), "not a corral output folder: no summary.json"),
    ],
)
def test_a_folder_that_is_not_corrals_output_is_a_clean_error(tmp_path: Path, make: Any, message: str) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    make(folder)
    code, text = invoke("report", str(folder))
    assert code == 2 and "error:" in text and message in " ".join(text.split()), text
    code, text = invoke("report", str(tmp_path / "nowhere"))
    assert code == 2 and "not a folder" in text, text


def test_summary_that_is_not_json_names_the_file(compared: Path, tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(compared / "fifo", folder)
    (folder / "summary.json").write_text("{oops")
    code, text = invoke("report", str(folder))
    assert code == 2 and "summary.json: not JSON" in " ".join(text.split()), text


@needs_matplotlib
def test_report_has_no_network_resource(compared: Path) -> None:
    page = (compared / "report.html").read_text()
    urls = _resource_urls(page)
    assert urls and all(u.startswith("data:image/png;base64,") for u in urls), urls
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, flags=re.IGNORECASE)
    assert "<script" not in page.lower() and "@import" not in page and "url(" not in page


def test_without_matplotlib_the_report_keeps_its_tables(
    compared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    out = tmp_path / "plain"
    rendered = render_report(find_runs([compared]), out)
    assert rendered.missing is not None and INSTALL_HINT in rendered.missing
    assert [p.name for p in rendered.paths] == ["report.html"]
    assert not any((out / name).exists() for name in PLOT_FILES)
    page = (out / "report.html").read_text()
    assert INSTALL_HINT in page.replace("&#x27;", "'") and "<img" not in page
    assert "<td>avg_jct_s</td>" in page
    # And from the command line: written, with a note, no crash.
    code, text = invoke("simulate", *REPLAY, "--out", str(tmp_path / "sim"))
    assert code == 0, text
    assert (tmp_path / "sim" / "report.html").is_file() and "report.html has no plots" in text


@needs_matplotlib
def test_simulate_writes_the_report_unless_told_not_to(tmp_path: Path) -> None:
    code, text = invoke("simulate", *REPLAY, "--policy", "srtf", "--out", str(tmp_path / "a"))
    assert code == 0, text
    for name in ALWAYS:
        _check_png(tmp_path / "a" / name)
    assert "<th>srtf(" in (tmp_path / "a" / "report.html").read_text()
    code, text = invoke("simulate", *REPLAY, "--out", str(tmp_path / "b"), "--no-report")
    assert code == 0, text
    assert not (tmp_path / "b" / "report.html").exists() and (tmp_path / "b" / "summary.json").exists()
    # --overwrite clears the report of an earlier run with the rest of corral's files.
    code, text = invoke("simulate", *REPLAY, "--out", str(tmp_path / "a"), "--no-report", "--overwrite")
    assert code == 0, text
    assert not any((tmp_path / "a" / name).exists() for name in ("report.html", *PLOT_FILES))


@needs_matplotlib
def test_report_loads_in_chromium_without_errors(compared: Path) -> None:
    executable = chromium()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto((compared / "report.html").as_uri(), wait_until="load")
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
            title = page.title()
        finally:
            browser.close()
    assert not errors, errors
    assert len(widths) == len(ALWAYS) and all(w > 0 for w in widths), widths
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert title.startswith("corral report: 60 jobs")


def test_the_queue_length_counts_every_wait(tmp_path: Path) -> None:
    """SRTF preempts: a preempted job waits again. ``queue_mean`` integrates to every job's time pending (Little's
    law on the replay's own numbers), not only to the waits for a first start."""
    out = tmp_path / "srtf"
    code, text = invoke("simulate", *REPLAY, "--policy", "srtf", "--out", str(out), "--no-report")
    assert code == 0, text
    with (out / "jobs.csv").open() as f:
        jobs = list(csv.DictReader(f))
    assert any(int(j["preemptions"]) > 0 for j in jobs)  # there are second waits to count
    waited = sum(float(j["queueing_s"]) for j in jobs)
    first = sum(float(j["start_s"]) - float(j["submit_s"]) for j in jobs if j["start_s"])
    assert waited > first * 1.01
    with (out / "utilization.csv").open() as f:
        rows = list(csv.DictReader(f))
    bin_s = float(rows[1]["time_s"]) - float(rows[0]["time_s"])
    area = sum(float(r["queue_mean"]) * bin_s for r in rows)
    assert area == pytest.approx(waited, rel=1e-4)


@needs_matplotlib
def test_a_folder_from_before_queue_mean_still_plots_its_first_waits(compared: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(compared / "srtf", old)
    path = old / "utilization.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert "queue_mean" in rows[0]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, [k for k in rows[0] if k != "queue_mean"], lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    code, text = invoke("report", str(old))
    assert code == 0, text
    _check_png(old / "queue_length.png")
