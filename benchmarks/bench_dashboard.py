"""The dashboard's figures: first paint of its pages with a large live state, and what an open dashboard costs the
controller's scheduling rounds.

State: ``--jobs`` pending jobs in the store (tenant ``queued``, quota 0: they stay queued, each examined by every
round; ``bench_api_list.fill``) and ``--gpus`` stand-in GPUs, ``--sleepers`` of them running a sleeping job of
tenant ``busy``; policy FIFO with backfilling, so that every round walks the whole queue.

1. First paint: Chromium (Playwright, the system's executable) logs in and loads the cluster page and the queue
   page ``--loads`` times each; the figures are the medians of the browser's own performance timing: first
   contentful paint (the server-rendered tables), and the page's first JSON poll drawn (the charts of the last
   hour, and the tables again: the ``live`` badge set by ``dashboard.js``).
2. Round latency, dashboard closed against open: a steady stream of short jobs (``true``, ``--rate`` a second,
   on the GPUs the sleepers leave free) keeps the scheduler busy; the mean round latency is read from
   ``GET /metrics`` (``corral_round_duration_seconds`` sum / count, the controller's own LiveStats histogram) over
   each phase of ``--phase-s`` seconds. Phases alternate closed, open, closed, open, ... (``--pairs`` pairs);
   "open" is a browser with the cluster page and the queue page each polling every 2 s. Prints each phase and
   the growth of the median open phase over the median closed phase (issue 17 asks for at most 5%).

    python benchmarks/bench_dashboard.py                        # 1,000 jobs, 64 GPUs
    python benchmarks/bench_dashboard.py --pairs 3 --phase-s 40
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import free_port, wait_healthy
from bench_api_list import SERVE, TOKEN, fill


def _rounds(http: httpx.Client) -> tuple[float, float]:
    """(sum of round seconds, rounds) from /metrics."""
    total = count = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("corral_round_duration_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("corral_round_duration_seconds_count"):
            count = float(line.split()[-1])
    return total, count


def _login(page: Any, url: str) -> None:
    page.goto(url + "/login")
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")


# The first contentful paint of the page, as the browser timed it (waiting for the entry if it is not out yet).
_FCP = """() => new Promise((resolve) => {
  new PerformanceObserver((list) => {
    const paint = list.getEntriesByName('first-contentful-paint')[0];
    if (paint) resolve(paint.startTime);
  }).observe({type: 'paint', buffered: true});
})"""


def first_paint(browser: Any, url: str, path: str, loads: int) -> tuple[float, float]:
    """Median first contentful paint and median time to the first poll drawn (ms) of ``path``."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    login = context.new_page()
    _login(login, url)
    login.close()  # the cluster page it landed on would poll all along
    paints, polled = [], []
    for _ in range(loads + 1):  # the first load warms the server's caches and the browser's: not counted
        page = context.new_page()  # a fresh page each time: its paint timing is this load's
        t0 = time.perf_counter()
        page.goto(url + path, wait_until="load")
        page.wait_for_function("() => document.getElementById('live').textContent === 'live'", polling=10)
        polled.append((time.perf_counter() - t0) * 1000)
        paints.append(float(page.evaluate(_FCP)))
        page.close()
    context.close()
    return statistics.median(paints[1:]), statistics.median(polled[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="pending jobs in the store (quota 0)")
    parser.add_argument("--gpus", type=int, default=64, help="stand-in GPUs")
    parser.add_argument("--sleepers", type=int, default=48, help="GPUs running a sleeping job")
    parser.add_argument("--loads", type=int, default=7, help="page loads timed per page (median)")
    parser.add_argument("--rate", type=float, default=4.0, help="short jobs submitted per second in phase 2")
    parser.add_argument("--phase-s", type=float, default=30.0, help="seconds of each phase of part 2")
    parser.add_argument("--pairs", type=int, default=3, help="closed/open pairs of phases in part 2")
    parser.add_argument("--policy", default="fifo:backfill=true", help="the scheduling policy")
    parser.add_argument("--only", choices=("paint", "rounds"), help="run only part 1 (paint) or part 2 (rounds)")
    args = parser.parse_args()
    found = [shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")]
    executable = next((path for path in found if path), None)
    if executable is None:
        raise SystemExit("needs a Chromium executable on PATH (apt-get install chromium) and Playwright")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        fill(state, args.jobs)
        config = Path(tmp) / "corral.toml"
        config.write_text(
            f'[server]\npolicy = "{args.policy}"\nadmin_token = "{TOKEN}"\n\n'
            f'[[tenants]]\nname = "queued"\nquota_gpus = 0\n\n[[tenants]]\nname = "busy"\nquota_gpus = {args.gpus}\n'
        )
        config.chmod(0o600)  # it holds the admin token
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [*SERVE, "--config", str(config), "--state-dir", str(state), "--port", str(port), "--quiet"]
        server = subprocess.Popen([*command, "--gpus", str(args.gpus)], stdout=subprocess.DEVNULL)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        ids: list[str] = []
        try:
            wait_healthy(url, server, 300)
            with httpx.Client(base_url=url, headers=headers, timeout=600) as http, sync_playwright() as p:
                sleeper = {"command": [sys.executable, "-c", "import time; time.sleep(3600)"], "cwd": tmp}
                for _ in range(args.sleepers):
                    ids.append(http.post("/v1/jobs", json={**sleeper, "tenant": "busy"}).json()["job_id"])
                deadline = time.monotonic() + 180
                while sum(http.get(f"/v1/jobs/{i}").json()["phase"] == "running" for i in ids) < len(ids):
                    if time.monotonic() > deadline:
                        raise SystemExit("the sleeping jobs did not all start")
                    time.sleep(0.5)
                time.sleep(6)  # a history sample or two
                browser = p.chromium.launch(executable_path=executable)
                print(f"{args.jobs:,} pending jobs, {args.gpus} stand-in GPUs ({args.sleepers} running a job)")
                if args.only != "rounds":
                    for name, path in (("cluster", "/"), ("queue", "/queue")):
                        paint, drawn = first_paint(browser, url, path, args.loads)
                        print(f"{name + ' page:':14} first contentful paint {paint:.0f} ms, first poll drawn "
                              f"{drawn:.0f} ms (median of {args.loads})")  # fmt: skip
                closed, opened = [], []
                if args.only != "paint":
                    closed, opened = rounds_with_and_without(http, browser, url, args)
                browser.close()
        finally:
            # The sleepers are stopped whatever happened (a stopped server leaves job processes running).
            with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
                for job_id in ids:
                    http.post(f"/v1/jobs/{job_id}/cancel")
                deadline = time.monotonic() + 30
                while ids and time.monotonic() < deadline:
                    if all(http.get(f"/v1/jobs/{i}").json()["process"]["phase"] == "none" for i in ids):
                        break
                    time.sleep(0.5)
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    if not closed:
        return
    base, with_dash = statistics.median(closed), statistics.median(opened)
    print(f"round latency, dashboard closed: {' '.join(f'{x:.3f}' for x in closed)} ms (median {base:.3f} ms)")
    print(f"round latency, dashboard open:   {' '.join(f'{x:.3f}' for x in opened)} ms (median {with_dash:.3f} ms)")
    print(f"growth with the dashboard open: {(with_dash / base - 1) * 100:+.1f}% (issue 17: at most +5%)")


def rounds_with_and_without(
    http: httpx.Client, browser: Any, url: str, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """Mean round latency (ms) of each closed and each open phase, under a steady stream of short jobs."""
    stop = threading.Event()
    submitted = [0]

    def stream() -> None:
        with httpx.Client(base_url=url, headers=http.headers, timeout=60) as client:
            body = {"command": ["true"], "tenant": "busy", "cwd": "/tmp"}
            next_t = time.monotonic()
            while not stop.is_set():
                client.post("/v1/jobs", json=body)
                submitted[0] += 1
                next_t += 1 / args.rate
                stop.wait(max(0.0, next_t - time.monotonic()))

    feeder = threading.Thread(target=stream, daemon=True)
    feeder.start()
    time.sleep(5)  # into the steady state
    closed: list[float] = []
    opened: list[float] = []
    try:
        for _ in range(args.pairs):
            for is_open in (False, True):
                context = None
                if is_open:
                    context = browser.new_context(viewport={"width": 1440, "height": 1000})
                    first = context.new_page()
                    _login(first, url)  # the cluster page, polling
                    context.new_page().goto(url + "/queue")  # and the queue page, polling
                    time.sleep(2)
                s0, n0 = _rounds(http)
                time.sleep(args.phase_s)
                s1, n1 = _rounds(http)
                if context is not None:
                    context.close()
                mean_ms = (s1 - s0) / (n1 - n0) * 1000 if n1 > n0 else float("nan")
                (opened if is_open else closed).append(mean_ms)
                print(f"  phase {'open  ' if is_open else 'closed'}: {int(n1 - n0)} rounds, mean {mean_ms:.3f} ms")
    finally:
        stop.set()
        feeder.join(timeout=10)
    return closed, opened


if __name__ == "__main__":
    main()
