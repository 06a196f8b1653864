"""Fixtures for the job-side library's tests: a short temporary directory and a live :class:`AgentPeer`."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from job_agent_peer import AgentPeer


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory (a Unix socket path must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cj-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def peer(short_tmp: Path) -> Iterator[AgentPeer]:
    p = AgentPeer(str(short_tmp / "agent.sock"))
    yield p
    p.stop()
