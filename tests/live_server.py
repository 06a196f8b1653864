"""A real ``corral serve`` in a child process, for the tests that drive it over HTTP (the CLI's and the
kill -9 recovery test)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    state_dir: Path
    banner: str


def start_server(state_dir: Path, *args: str) -> Server:
    port = free_port()
    process = subprocess.Popen(
        [PY, "-m", "corral.cli.main", "serve", "--state-dir", str(state_dir), "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"corral serve exited with {process.returncode}:\n{out}\n{err}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "corral serve did not come up"
        time.sleep(0.1)
    assert process.stdout is not None
    banner = process.stdout.readline()
    return Server(process, url, state_dir, banner)


def stop_server(server: Server, sig: int = signal.SIGTERM) -> tuple[int, str]:
    process = server.process
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    err = process.stderr.read() if process.stderr is not None else ""
    return process.returncode, err
