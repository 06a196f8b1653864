"""Reading large live state: one page of the job list over the HTTP API, and ``corral jobs`` as a table, with
50,000 jobs in the store.

Fills a fresh state directory with ``--jobs`` pending jobs of a tenant whose quota is 0 GPUs (so they stay
queued and no process is ever started), runs ``corral serve`` on it (stand-in GPU, FIFO), then times:

- ``API page``: ``GET /v1/jobs?limit=PAGE`` (pending and running jobs), median of ``--repeat`` requests;
- ``API default``: ``GET /v1/jobs`` with no query (what a client gets by default);
- ``API every page``: the whole list, following ``next_cursor`` in pages of 1,000 (one request when the server
  does not page);
- ``corral jobs``: the CLI command, table form, default options, in a fresh interpreter (wall time, so it
  includes starting Python and importing corral: ``corral --version`` is timed too, for reference).

    python benchmarks/bench_api_list.py                 # 50,000 jobs
    python benchmarks/bench_api_list.py --jobs 5000
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import free_port, wait_healthy

from corral.core.job import JobSpec
from corral.core.status import JobStatus
from corral.live.records import JobRequest, ProcessState
from corral.live.store import Store

TOKEN = "bench-admin-token-0123456789"
SERVE = [sys.executable, "-m", "corral.cli.main", "serve"]


def fill(state: Path, n: int) -> None:
    """``n`` pending jobs of tenant ``queued`` (quota 0: never placed), written straight to the store."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store(state / "corral.db")
    now = time.time() - n
    with store.transaction():
        for seq in range(1, n + 1):
            job_id = secrets.token_hex(8)  # unique in practice; the store's UNIQUE constraint would say otherwise
            request = JobRequest(
                command=("python", "train.py", "--epochs", "5"),
                tenant="queued",
                name=f"job-{seq}",
                cwd="/tmp",
                env={"SEED": str(seq)},
            )
            spec = JobSpec(job_id=job_id, submit_s=now + seq, num_gpus=1, tenant="queued")
            store.insert(seq, request, JobStatus(spec=spec, queued_since_s=spec.submit_s), ProcessState())
    store.close()


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--page", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5, help="requests per API figure (median)")
    parser.add_argument("--cli-repeat", type=int, default=3, help="runs of each CLI command (median)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        t0 = time.perf_counter()
        fill(state, args.jobs)
        filled_s = time.perf_counter() - t0
        config = Path(tmp) / "corral.toml"
        config.write_text(
            f'[server]\npolicy = "fifo"\nadmin_token = "{TOKEN}"\n\n[[tenants]]\nname = "queued"\nquota_gpus = 0\n'
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        server = subprocess.Popen(
            [*SERVE, "--config", str(config), "--state-dir", str(state), "--port", str(port), "--gpus", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            wait_healthy(url, server, 300)
            up_s = time.perf_counter() - started
            with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
                active = [("phase", "pending"), ("phase", "running")]

                def page() -> Any:
                    r = http.get("/v1/jobs", params=[*active, ("limit", str(args.page))])
                    r.raise_for_status()
                    return r.json()

                def default() -> Any:
                    r = http.get("/v1/jobs")
                    r.raise_for_status()
                    return r.json()

                def every_page() -> int:
                    # Pages of the most a page holds (1000), where the server pages; else its one answer.
                    count, params = 0, [*active, ("limit", "1000")]
                    while True:
                        r = http.get("/v1/jobs", params=params if count else active)
                        r.raise_for_status()
                        body = r.json()
                        count += len(body["jobs"])
                        cursor = body.get("next_cursor")
                        if not cursor:
                            return count
                        params = [*active, ("limit", "1000"), ("cursor", cursor)]

                page()
                default()  # warm-up: the first read of the table's pages comes from the disk
                page_s, one = timed(page, args.repeat)
                default_s, dflt = timed(default, args.repeat)
                every_s, total = timed(every_page, 1)

            env = {**os.environ, "CORRAL_URL": url, "CORRAL_TOKEN": TOKEN, "COLUMNS": "200"}
            cli = [sys.executable, "-m", "corral.cli.main"]

            def run_cli(*words: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([*cli, *words], env=env, capture_output=True, text=True, check=False)

            version_s, _ = timed(lambda: run_cli("--version"), args.cli_repeat)
            table_s, table = timed(lambda: run_cli("jobs"), args.cli_repeat)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)

    print(f"{args.jobs:,} pending jobs in the store (filled in {filled_s:.1f} s; server up in {up_s:.1f} s)")
    print(f"API page      GET /v1/jobs?limit={args.page}   {page_s * 1000:9.1f} ms   ({len(one['jobs'])} jobs)")
    print(f"API default   GET /v1/jobs            {default_s * 1000:9.1f} ms   ({len(dflt['jobs'])} jobs)")
    print(f"API every page                        {every_s * 1000:9.1f} ms   ({total:,} jobs)")
    if table.returncode == 0:
        shown = f"{table.stdout.count(chr(10)):,} lines printed"
    else:
        shown = f"FAILED: {table.stderr.strip()[-200:]}"
    print(f"corral jobs   table, default          {table_s * 1000:9.1f} ms   ({shown})")
    print(f"corral --version (Python + imports)   {version_s * 1000:9.1f} ms")


if __name__ == "__main__":
    main()
