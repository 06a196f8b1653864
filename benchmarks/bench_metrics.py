"""``GET /metrics`` scrape time with a large live state: 10,000 jobs in the store and 64 stand-in GPUs, 64 of the
jobs running (real sleeping processes), the rest pending.

Fills a fresh state directory with ``--jobs`` pending jobs of a tenant whose quota is 0 GPUs (so they stay queued:
``bench_api_list.fill``), runs ``corral serve`` on it (``--gpus`` stand-in GPUs, FIFO with backfilling, so that the
queued jobs at the head do not hold the others back), submits one sleeping job
per GPU for a second tenant, waits until they all run, then times ``GET /metrics`` (median of ``--repeat``
scrapes, after one warm-up) and prints the size of the answer and its series count.

    python benchmarks/bench_metrics.py                    # 10,000 jobs, 64 GPUs
    python benchmarks/bench_metrics.py --jobs 1000 --gpus 8
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import free_port, wait_healthy
from bench_api_list import SERVE, TOKEN, fill, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the store, pending (quota 0)")
    parser.add_argument("--gpus", type=int, default=64, help="stand-in GPUs, each running one job")
    parser.add_argument("--repeat", type=int, default=20, help="scrapes timed (median)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        fill(state, args.jobs)
        config = Path(tmp) / "corral.toml"
        config.write_text(
            f'[server]\npolicy = "fifo:backfill=true"\nadmin_token = "{TOKEN}"\n\n'
            f'[[tenants]]\nname = "queued"\nquota_gpus = 0\n\n[[tenants]]\nname = "busy"\nquota_gpus = {args.gpus}\n'
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [*SERVE, "--config", str(config), "--state-dir", str(state), "--port", str(port)]
        server = subprocess.Popen(
            [*command, "--gpus", str(args.gpus)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            wait_healthy(url, server, 300)
            with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
                sleeper = {"command": [sys.executable, "-c", "import time; time.sleep(600)"], "cwd": tmp}
                ids = [
                    http.post("/v1/jobs", json={**sleeper, "tenant": "busy"}).json()["job_id"] for _ in range(args.gpus)
                ]
                deadline = time.monotonic() + 120
                while sum(http.get(f"/v1/jobs/{i}").json()["phase"] == "running" for i in ids) < len(ids):
                    if time.monotonic() > deadline:
                        raise SystemExit("the sleeping jobs did not all start")
                    time.sleep(0.5)

                def scrape() -> str:
                    r = http.get("/metrics")
                    r.raise_for_status()
                    return r.text

                scrape()  # warm-up
                scrape_s, text = timed(scrape, args.repeat)
                for job_id in ids:
                    http.post(f"/v1/jobs/{job_id}/cancel")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)

    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"{args.jobs:,} pending jobs in the store, {args.gpus} stand-in GPUs each running one job")
    print(
        f"GET /metrics   median of {args.repeat}: {scrape_s * 1000:.1f} ms   ({len(text):,} bytes, {series:,} series)"
    )


if __name__ == "__main__":
    main()
