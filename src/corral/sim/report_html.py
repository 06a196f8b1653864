"""The report of one or more replays: ``report.html`` and its plots as PNG files, made from output folders.

Input: the ``--out`` folders of ``corral simulate`` and ``corral compare`` (:mod:`corral.sim.report` writes
them), read back from their files (``summary.json``, ``jobs.csv``, ``tenants.csv``, ``utilization.csv``) rather
than from a :class:`~corral.sim.runner.SimulationResult`: the report made right after a replay and one re-made
later by ``corral report`` (from one folder, or from several side by side, before and after a change) come from
the same data by the same code. A folder holds one run (``summary.json`` in it) or one run per sub-folder (a
comparison: the order of its ``comparison.json``, else the sub-folders by name). A folder that is neither is an
error naming it.

Plots, one line or bar per run, each written as ``NAME.png`` beside ``report.html`` and embedded in it:

- ``jct_cdf.png``: CDF of the JCT (end - submit) of finished jobs;
- ``queueing_cdf.png``: CDF of the seconds each finished job spent pending (``queueing_s``: every wait);
- ``queue_length.png``: jobs waiting over time, every wait counted (a preempted job waits again): the mean per
  time bin of ``utilization.csv``'s ``queue_mean``. A folder written before that column existed gives the jobs
  waiting for their first start instead, from ``jobs.csv``'s ``submit_s`` and ``start_s``, and says so;
- ``utilization.png``: per time bin of ``utilization.csv``, the fraction of the GPUs allocated and, where
  measured, of GPU time kept busy (SM) and of GPU memory in use;
- ``rho_cdf.png``: CDF of the finish-time fairness rho of finished jobs (Themis);
- ``tenant_quota.png``, when a run has quotas: per tenant with one, the GPUs its guaranteed jobs held on
  average as a fraction of its quota (``quota_use``) and its shortfall in GPU-hours (``tenants.csv``);
- ``g_slowdown_cdf.png`` and ``opp_throughput.png``, when a run has opportunistic jobs (AntMan): the CDF of the
  slowdown of the jobs submitted as guaranteed; each run's ``opp_throughput``, and the CDF of each
  opportunistic job's progress rate while running (1 / its slowdown).

Times on the plots are hours from the start of the trace. ``report.html`` is one self-contained file: inline
CSS, the plots as ``data:`` URIs, no script, nothing fetched from anywhere. It shows the runs (policy, cluster,
trace, notes), the summary metrics side by side, every plot and each run's ``tenants.csv``. The plots need
matplotlib (the ``report`` extra: ``pip install 'corral[report]'``), drawn on its Agg canvas (no display needed);
without it the report still has every table and says, where the plots would be, how to get them.

The files hold no date, wall-clock time or absolute path: the same folders give the same report.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.errors import ConfigError, InputError
from corral.sim.metrics import SUMMARY_KEYS
from corral.sim.plot_labels import short_labels

# numpy is imported where a plot is drawn: every replay with --out imports this module (for REPORT_FILES, through
# corral.sim.report), and one with --no-report uses no numpy at all (issue 20).
if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'corral[report]'"

# A CDF of more points than this is drawn through this many evenly spaced quantiles: the curve looks the same at
# any size a report is read at, and 82,000-job traces render in a moment.
_CDF_POINTS = 2000
_RUN_FILES = ("summary.json", "jobs.csv", "tenants.csv", "utilization.csv")
_NOT_OURS = "expected the --out folder of `corral simulate` or `corral compare`"


@dataclass(slots=True)
class RunData:
    """One run's result files, as read back: ``label`` names it on the plots and in the tables."""

    label: str
    folder: Path
    summary: dict[str, Any]
    jobs: list[dict[str, str]]
    tenants: list[dict[str, str]]
    utilization: list[dict[str, str]]


@dataclass(slots=True)
class Rendered:
    """What :func:`render_report` wrote: ``report.html`` first, then the plots; ``missing`` says why there are
    no plots (matplotlib not installed), or is None."""

    paths: list[Path] = field(default_factory=list)
    missing: str | None = None


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def load_run(folder: str | Path, label: str | None = None) -> RunData:
    """The run whose results are in ``folder``; ``label`` defaults to its policy as ``summary.json`` names it."""
    path = Path(folder)
    missing = [name for name in _RUN_FILES if not (path / name).is_file()]
    if missing:
        raise ConfigError(f"{path}: not a corral output folder: {', '.join(missing)} missing; {_NOT_OURS}")
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not JSON ({exc})", file=str(path / "summary.json")) from None
    if not isinstance(summary, dict) or "policy" not in summary:
        raise InputError("not a corral summary", file=str(path / "summary.json"), expected="an object with 'policy'")
    jobs = _read_csv(path / "jobs.csv")
    for column in ("job_id", "submit_s", "start_s", "end_s", "status"):
        if jobs and column not in jobs[0]:
            raise InputError("not corral's jobs.csv", file=str(path / "jobs.csv"), column=column, expected="present")
    return RunData(
        label=label or str(summary["policy"]),
        folder=path,
        summary=summary,
        jobs=jobs,
        tenants=_read_csv(path / "tenants.csv"),
        utilization=_read_csv(path / "utilization.csv"),
    )


def _comparison_folders(folder: Path) -> list[tuple[str, Path]]:
    """A comparison's runs as (label, sub-folder), in the order of its ``comparison.json`` when it has a usable
    one (the order of the ``--policy`` options), else every sub-folder holding a ``summary.json``, by name."""
    listed = folder / "comparison.json"
    if listed.is_file():
        try:
            rows = json.loads(listed.read_text())
            found = [(str(r["policy_spec"]), folder / str(r["folder"])) for r in rows]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            found = []  # damaged: fall back on the sub-folders themselves
        if found and all((sub / "summary.json").is_file() for _, sub in found):
            return found
    return [(sub.name, sub) for sub in sorted(folder.iterdir()) if (sub / "summary.json").is_file()]


def find_runs(dirs: Sequence[str | Path]) -> list[RunData]:
    """Every run in ``dirs`` (simulate or compare folders). With several folders each label starts with its
    folder's name (its path as given, where two names are alike), so that before and after stay apart."""
    names = [Path(d).name or str(d) for d in dirs]
    runs: list[RunData] = []
    for given, name in zip(dirs, names, strict=True):
        folder = Path(given)
        if not folder.is_dir():
            raise ConfigError(f"{given}: not a folder; {_NOT_OURS}")
        prefix = "" if len(dirs) == 1 else (name if names.count(name) == 1 else str(given))
        if (folder / "summary.json").is_file():
            run = load_run(folder)
            if prefix:
                run.label = f"{prefix}: {run.label}"
            runs.append(run)
            continue
        subs = _comparison_folders(folder)
        if not subs:
            raise ConfigError(
                f"{given}: not a corral output folder: no summary.json in it or its sub-folders; {_NOT_OURS}"
            )
        runs.extend(load_run(sub, f"{prefix}/{label}" if prefix else label) for label, sub in subs)
    return runs


# -- reading the columns ------------------------------------------------------------------------------------------


def _values(run: RunData, rows: Iterable[dict[str, str]], column: str, file: str) -> np.ndarray:
    """The column's non-empty cells as floats; a cell that is not a number is an error naming the file."""
    import numpy as np

    out = []
    for row in rows:
        cell = row.get(column) or ""
        if not cell:
            continue
        try:
            out.append(float(cell))
        except ValueError:
            raise InputError("not a number", file=str(run.folder / file), column=column, got=cell) from None
    return np.asarray(out, float)


def _finished(run: RunData) -> list[dict[str, str]]:
    return [j for j in run.jobs if j.get("status") == "finished"]


def _queue_length(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """Jobs waiting for their first start, as a step function ``(times_s, count from each time on)``: +1 at
    submission, -1 at the first start, or at the last end for a job that never started (rejected jobs never
    wait: they are refused on admission)."""
    import numpy as np

    waiting = [j for j in run.jobs if j.get("status") != "rejected"]
    submit = _values(run, waiting, "submit_s", "jobs.csv")
    if len(submit) != len(waiting):
        raise InputError("a job without submit_s", file=str(run.folder / "jobs.csv"), column="submit_s")
    ends = _values(run, run.jobs, "end_s", "jobs.csv")
    last = max(float(ends.max()) if len(ends) else 0.0, float(submit.max()) if len(submit) else 0.0)
    start = np.asarray([float(j["start_s"]) if j.get("start_s") else last for j in waiting], float)
    times = np.concatenate([submit, start])
    deltas = np.concatenate([np.ones(len(submit)), -np.ones(len(start))])
    order = np.lexsort((deltas, times))
    t, count = times[order], np.cumsum(deltas[order])
    # Several changes at one instant (a job started as it arrived): keep the count after the last of them.
    keep = np.append(t[1:] != t[:-1], True) if len(t) else np.zeros(0, bool)
    return t[keep], count[keep]


# -- plots --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plot:
    """One plot: its file name, a title and a sentence under it in the HTML."""

    file: str
    title: str
    caption: str


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    x = np.sort(values)
    y = np.arange(1, len(x) + 1) / len(x)
    if len(x) > _CDF_POINTS:
        idx = np.linspace(0, len(x) - 1, _CDF_POINTS).round().astype(int)
        x, y = x[idx], y[idx]
    return x, y


def _label(text: str) -> str:
    # matplotlib reads "$...$" as math and hides labels that start with "_": a policy spec is plain text.
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _cdf_axes(ax: Axes, series: Sequence[tuple[str, np.ndarray]], xlabel: str) -> None:
    """CDF curves on ``ax``; a log x axis when the values span more than two decades (JCTs of seconds to days),
    with a linear stretch near 0 when some are 0 (jobs that never waited)."""
    import numpy as np

    shown = [(label, v) for label, v in series if len(v)]
    for label, values in shown:
        x, y = _cdf(values)
        ax.plot(x, y, drawstyle="steps-post", label=_label(label))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if shown:
        everything = np.concatenate([v for _, v in shown])
        positive = everything[everything > 0]
        if len(positive) and positive.max() > 100 * positive.min():
            if (everything <= 0).any():
                ax.set_xscale("symlog", linthresh=float(max(positive.min(), 1e-3)))
                ax.set_xlim(left=0)  # symlog would show a mirrored negative half
            else:
                ax.set_xscale("log")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no jobs to show", ha="center", va="center", transform=ax.transAxes)


def _jct(runs: Sequence[RunData], fig: Figure) -> None:
    series = [(r.label, _values(r, _finished(r), "jct_s", "jobs.csv")) for r in runs]
    _cdf_axes(fig.subplots(), series, "job completion time (s)")


def _queueing(runs: Sequence[RunData], fig: Figure) -> None:
    series = [(r.label, _values(r, _finished(r), "queueing_s", "jobs.csv")) for r in runs]
    _cdf_axes(fig.subplots(), series, "time pending (s)")


def _queue(runs: Sequence[RunData], fig: Figure) -> None:
    ax = fig.subplots()
    first_only = False
    for run in runs:
        if run.utilization and "queue_mean" in run.utilization[0]:
            t = _values(run, run.utilization, "time_s", "utilization.csv")
            count = _values(run, run.utilization, "queue_mean", "utilization.csv")
        else:  # an older folder: first waits only, from jobs.csv
            t, count = _queue_length(run)
            first_only = True
        if len(t):
            ax.plot(t / 3600.0, count, drawstyle="steps-post", label=_label(run.label))
    ax.set_xlabel("time (h)")
    ax.set_ylabel("jobs waiting to start (first waits only)" if first_only else "jobs waiting (mean per bin)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.lines:  # a legend of nothing would warn
        ax.legend(fontsize="small")


_UTILIZATION = (
    ("gpu_alloc_frac", "GPUs allocated"),
    ("gpu_sm_frac", "GPU time busy (SM)"),
    ("gpu_mem_frac", "GPU memory in use"),
)


def _utilization(runs: Sequence[RunData], fig: Figure) -> None:
    columns = [(c, name) for c, name in _UTILIZATION if any(r.utilization and c in r.utilization[0] for r in runs)]
    if not columns:  # only a header: a replay always writes one bin at least, a folder edited by hand may not
        fig.subplots().text(0.5, 0.5, "no utilization data", ha="center", va="center")
        return
    axes = fig.subplots(len(columns), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (column, name) in zip(axes, columns, strict=True):
        for run in runs:
            if not run.utilization or column not in run.utilization[0]:
                continue
            t = _values(run, run.utilization, "time_s", "utilization.csv")
            v = _values(run, run.utilization, column, "utilization.csv")
            ax.plot(t / 3600.0, v, drawstyle="steps-post", label=_label(run.label))
        ax.set_ylabel(name, fontsize="small")
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize="small")
    axes[-1].set_xlabel("time (h)")


def _quota_tenants(runs: Sequence[RunData]) -> list[str]:
    return sorted({t["tenant"] for r in runs for t in r.tenants if t.get("quota_gpus")})


def _bars(ax: Axes, groups: Sequence[str], series: Sequence[tuple[str, Sequence[float]]]) -> None:
    """Grouped bars: one group per name of ``groups``, one bar per series in each."""
    import numpy as np

    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (label, values) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=_label(label))
    ax.set_xticks(x, [_label(g) for g in groups], rotation=30 if len(groups) > 6 else 0, ha="right")
    ax.grid(True, axis="y", alpha=0.3)


def _tenant_value(run: RunData, tenant: str, column: str) -> float:
    for row in run.tenants:
        if row["tenant"] == tenant and row.get(column):
            try:
                return float(row[column])
            except ValueError:
                raise InputError("not a number", file=str(run.folder / "tenants.csv"), column=column) from None
    return math.nan  # no quota for it in this run, or no such tenant: no bar


def _quota(runs: Sequence[RunData], fig: Figure) -> None:
    tenants = _quota_tenants(runs)
    use_ax, short_ax = fig.subplots(1, 2)
    _bars(use_ax, tenants, [(r.label, [_tenant_value(r, t, "quota_use") for t in tenants]) for r in runs])
    use_ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    use_ax.set_ylabel("GPUs held / quota (mean)")
    _bars(short_ax, tenants, [(r.label, [_tenant_value(r, t, "shortfall_gpu_h") for t in tenants]) for r in runs])
    short_ax.set_ylabel("shortfall (GPU-hours)")
    use_ax.legend(fontsize="small")


def _rho(runs: Sequence[RunData], fig: Figure) -> None:
    series = [(r.label, _values(r, _finished(r), "rho", "jobs.csv")) for r in runs]
    ax = fig.subplots()
    _cdf_axes(ax, series, "finish-time fairness rho (1 = as fast as alone on a fair share)")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)


def _has_opportunistic(runs: Sequence[RunData]) -> bool:
    return any(float(r.summary.get("opp_jobs") or 0) > 0 for r in runs)


def _g_slowdown(runs: Sequence[RunData], fig: Figure) -> None:
    # The class at the end: "guaranteed" was submitted so ("upgraded" began opportunistic), as the summary counts.
    series = [
        (r.label, _values(r, (j for j in r.jobs if j.get("job_class") == "guaranteed"), "slowdown", "jobs.csv"))
        for r in runs
    ]
    _cdf_axes(fig.subplots(), series, "slowdown of guaranteed jobs (1 = never slowed by a neighbour)")


def _opp(runs: Sequence[RunData], fig: Figure) -> None:
    import numpy as np

    bar_ax, cdf_ax = fig.subplots(1, 2, width_ratios=[1, 2])
    labels = [r.label for r in runs]
    # Each run's bar in its colour on the other plots (the default colour cycle, in run order).
    colors = [f"C{i % 10}" for i in range(len(runs))]
    bar_ax.bar(np.arange(len(runs)), [float(r.summary.get("opp_throughput") or 0) for r in runs], color=colors)
    bar_ax.set_xticks(np.arange(len(runs)), [_label(x) for x in labels], rotation=30, ha="right")
    bar_ax.set_ylabel("opportunistic throughput (solo s / run s)")
    bar_ax.set_ylim(0, 1.05)
    bar_ax.grid(True, axis="y", alpha=0.3)
    series = []
    for r in runs:
        opp = (j for j in r.jobs if j.get("job_class") in ("opportunistic", "upgraded"))
        slow = _values(r, opp, "slowdown", "jobs.csv")
        series.append((r.label, 1.0 / slow[slow > 0]))
    _cdf_axes(cdf_ax, series, "progress rate of opportunistic jobs (1 / slowdown)")


@dataclass(frozen=True, slots=True)
class _PlotSpec:
    plot: Plot
    wanted: Callable[[Sequence[RunData]], bool]
    draw: Callable[[Sequence[RunData], Figure], None]
    size: tuple[float, float] = (7.5, 4.2)


def _always(runs: Sequence[RunData]) -> bool:
    return True


_PLOTS = (
    _PlotSpec(Plot("jct_cdf.png", "Job completion time", "CDF over finished jobs of end - submit."), _always, _jct),
    _PlotSpec(
        Plot("queueing_cdf.png", "Queueing delay", "CDF over finished jobs of the seconds pending, every wait summed."),
        _always,
        _queueing,
    ),
    _PlotSpec(
        Plot(
            "queue_length.png",
            "Queue length",
            "Jobs submitted and not yet started, over time (a preempted job waiting again is not counted).",
        ),
        _always,
        _queue,
    ),
    _PlotSpec(
        Plot(
            "utilization.png",
            "GPU allocation and use",
            "Per time bin: GPUs allocated and, where measured, GPU time busy (SM) and GPU memory in use.",
        ),
        _always,
        _utilization,
        (7.5, 6.5),
    ),
    _PlotSpec(
        Plot("rho_cdf.png", "Finish-time fairness", "CDF over finished jobs of JCT / time alone on a fair share."),
        _always,
        _rho,
    ),
    _PlotSpec(
        Plot(
            "tenant_quota.png",
            "Tenants against their quotas",
            "Per tenant with a quota: mean GPUs its guaranteed jobs held over its quota, and GPU-hours of quota it "
            "asked for and did not get.",
        ),
        lambda runs: bool(_quota_tenants(runs)),
        _quota,
        (9.0, 4.2),
    ),
    _PlotSpec(
        Plot(
            "g_slowdown_cdf.png",
            "Guaranteed jobs' slowdown",
            "CDF over jobs submitted as guaranteed of seconds run / seconds alone for the same progress.",
        ),
        _has_opportunistic,
        _g_slowdown,
    ),
    _PlotSpec(
        Plot(
            "opp_throughput.png",
            "Opportunistic jobs' throughput",
            "Progress of opportunistic jobs while running, as a fraction of what they would make alone: "
            "per run, and per job.",
        ),
        _has_opportunistic,
        _opp,
        (9.0, 4.2),
    ),
)
PLOT_FILES = tuple(spec.plot.file for spec in _PLOTS)
REPORT_FILES = ("report.html", *PLOT_FILES)


def _draw(spec: _PlotSpec, runs: Sequence[RunData]) -> bytes:
    # A Figure on the Agg canvas, not pyplot: no global state, no display, nothing left open between reports.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=spec.size, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    spec.draw(runs, fig)
    fig.suptitle(spec.plot.title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"matplotlib is not installed: {INSTALL_HINT} for the plots"
    return None


def plot_runs(runs: Sequence[RunData]) -> list[tuple[Plot, bytes]]:
    """Each plot that applies to ``runs``, as PNG bytes (needs matplotlib). The runs are named on them by
    :func:`~corral.sim.plot_labels.short_labels`: a policy's options only where they tell runs apart."""
    named = [replace(r, label=short) for r, short in zip(runs, short_labels([r.label for r in runs]), strict=True)]
    return [(spec.plot, _draw(spec, named)) for spec in _PLOTS if spec.wanted(named)]


# -- HTML ---------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #555; }
.missing { background: #fff6e0; border: 1px solid #e8c66a; padding: 0.6em; }
ul.notes { font-size: 0.9em; color: #444; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.1f}" if key.endswith("_s") else f"{value:.4f}"


_NUM_CELL = '<td class="num">'


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], text_columns: int = 1) -> str:
    """An HTML table; the columns after the first ``text_columns`` hold numbers (aligned right)."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join((_NUM_CELL if i >= text_columns else "<td>") + f"{_esc(c)}</td>" for i, c in enumerate(row))
        + "</tr>\n"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>\n"


def _summary_table(runs: Sequence[RunData]) -> str:
    extra = ("policy", "cluster", "num_gpus", "trace", "trace_notes")
    keys = [*SUMMARY_KEYS]
    keys += [k for r in runs for k in r.summary if k not in keys and k not in extra]
    keys = list(dict.fromkeys(keys))
    rows = [[key, *(_fmt(key, r.summary[key]) if key in r.summary else "" for r in runs)] for key in keys]
    return _table(["metric", *(r.label for r in runs)], rows)


def _runs_table(runs: Sequence[RunData]) -> str:
    text = ("policy", "cluster", "trace")
    numbers = ("num_gpus", "jobs_total")
    rows = [
        [r.label, *(str(r.summary.get(k, "")) for k in text), *(_fmt(k, r.summary.get(k, "")) for k in numbers)]
        for r in runs
    ]
    return _table(["run", "policy", "cluster", "trace", "GPUs", "jobs"], rows, text_columns=4)


def _notes(runs: Sequence[RunData]) -> str:
    """The trace's notes: once when every run has the same, else per run."""
    notes = [[str(n) for n in r.summary.get("trace_notes") or []] for r in runs]
    if not any(notes):
        return ""
    if all(n == notes[0] for n in notes):
        return "<h3>Notes</h3>\n" + _list(notes[0])
    return "<h3>Notes</h3>\n" + "".join(
        f"<p>{_esc(r.label)}</p>\n{_list(n)}" for r, n in zip(runs, notes, strict=True) if n
    )


def _list(items: Sequence[str]) -> str:
    return '<ul class="notes">' + "".join(f"<li>{_esc(i)}</li>" for i in items) + "</ul>\n"


def _tenants(runs: Sequence[RunData]) -> str:
    parts = []
    for run in runs:
        if not run.tenants:
            continue
        header = list(run.tenants[0])
        rows = [[row.get(c, "") for c in header] for row in run.tenants]
        parts.append(f"<details open><summary>{_esc(run.label)}</summary>\n{_table(header, rows)}</details>\n")
    return "".join(parts)


def _title(runs: Sequence[RunData]) -> str:
    first = runs[0].summary
    same = all(r.summary.get(k) == first.get(k) for r in runs for k in ("trace", "cluster", "num_gpus", "jobs_total"))
    if same:
        jobs, trace, cluster, gpus = (first.get(k) for k in ("jobs_total", "trace", "cluster", "num_gpus"))
        return f"{jobs} jobs of {trace} on {cluster} ({gpus} GPUs)"
    return f"{len(runs)} runs"


def report_html(runs: Sequence[RunData], plots: Sequence[tuple[Plot, bytes]], missing: str | None) -> str:
    """The HTML page: tables of ``runs`` and ``plots`` embedded as data URIs (or, with ``missing``, a note
    saying why there are none)."""
    title = "corral report: " + _title(runs)
    if missing is not None:
        figures = f'<p class="missing">No plots: {_esc(missing)}, then <code>corral report</code> on this folder.</p>\n'
    else:
        figures = "".join(
            f'<figure id="{_esc(p.file[:-4])}"><img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
            f'alt="{_esc(p.title)}"><figcaption>{_esc(p.title)}: {_esc(p.caption)} '
            f"(<code>{_esc(p.file)}</code>)</figcaption></figure>\n"
            for p, png in plots
        )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{_esc(title)}</h1>\n<h2>Runs</h2>\n{_runs_table(runs)}{_notes(runs)}"
        f"<h2>Summary</h2>\n{_summary_table(runs)}"
        f"<h2>Plots</h2>\n{figures}"
        f"<h2>Tenants</h2>\n{_tenants(runs)}"
        "</body>\n</html>\n"
    )


def render_report(runs: Sequence[RunData], out_dir: str | Path) -> Rendered:
    """Write ``report.html`` and the plots of ``runs`` to ``out_dir`` (created if missing). Plot files of an
    earlier report there are deleted first, so that a plot that no longer applies does not linger."""
    if not runs:
        raise ConfigError("no runs to report on")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in PLOT_FILES:
        (out / name).unlink(missing_ok=True)
    missing = _matplotlib_missing()
    plots = plot_runs(runs) if missing is None else []
    page = out / "report.html"
    page.write_text(report_html(runs, plots, missing))
    done = Rendered([page], missing)
    for plot, png in plots:
        path = out / plot.file
        path.write_bytes(png)
        done.paths.append(path)
    return done


def report_folders(dirs: Sequence[str | Path], out_dir: str | Path) -> Rendered:
    """:func:`render_report` of every run in ``dirs`` (see :func:`find_runs`), written to ``out_dir``."""
    return render_report(find_runs(dirs), out_dir)
