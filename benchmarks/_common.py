"""Shared bits of the benchmark scripts: run one measurement in a fresh interpreter and collect its figures.

Each measurement runs in its own process so its peak memory (``ru_maxrss``) is its own and imports are paid
the same way a user pays them.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
from typing import Any


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(script: str, *args: str) -> dict[str, Any]:
    """Run ``python script --child args...``; the child prints one JSON object as its last line."""
    proc = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed ({' '.join(args)}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result))


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Wait until the ``corral serve`` process ``server`` answers ``GET url/v1/health``; exit if it dies first or
    ``timeout_s`` passes."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise SystemExit("corral serve did not come up")
        time.sleep(0.1)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a ``corral serve`` the benchmark starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
