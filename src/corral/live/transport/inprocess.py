"""The in-process transport: a node's :class:`~corral.live.agent.Agent` in this process, behind the
:class:`~corral.live.nodes.NodeAgent` interface (:class:`LocalNode`), for several nodes on one machine; the same
requests and reports that :mod:`corral.live.transport.ray` carries across machines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from corral.core import contract
from corral.live.agent import (
    Agent,
    AgentReport,
    LaunchRequest,
)
from corral.live.agent.gpus import GpuInfo
from corral.live.nodes import free_local_ports


class LocalNode:
    """A node whose agent runs in this process (several of them stand for several machines on one, in tests and
    to try multi-node scheduling on a laptop without Ray)."""

    def __init__(self, name: str, state_dir: Path, gpus: Sequence[GpuInfo], **agent_options: Any) -> None:
        self._name = name
        self._on_report: Callable[[AgentReport], None] | None = None
        self.agent = Agent(state_dir, gpus, self._report, **agent_options)

    def _report(self, report: AgentReport) -> None:
        if self._on_report is not None:
            self._on_report(report)

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str:
        return "127.0.0.1"

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self.agent.gpus

    def start(self, on_report: Callable[[AgentReport], None], on_lost: Callable[[str], None]) -> None:
        self._on_report = on_report
        self.agent.start()

    def close(self) -> None:
        self.agent.close()

    def launch(self, req: LaunchRequest) -> None:
        self.agent.launch(req)

    def preempt(self, job_id: str, run: int, *, seq: int | None = None) -> None:
        self.agent.preempt(job_id, run, seq=seq)

    def cancel(self, job_id: str, run: int) -> None:
        self.agent.cancel(job_id, run)

    def pause(self, job_id: str, run: int, *, evict: bool = False, seq: int | None = None) -> None:
        self.agent.pause(job_id, run, evict=evict, seq=seq)

    def resume(self, job_id: str, run: int, *, seq: int | None = None) -> None:
        self.agent.resume(job_id, run, seq=seq)

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        return self.agent.send(job_id, run, message)

    def adopt(self, job_id: str, run: int) -> bool:
        return self.agent.adopt(job_id, run)

    def free_ports(self, count: int) -> list[int]:
        return free_local_ports(count)

    def log_path(self, job_id: str) -> Path:
        return self.agent.log_path(job_id)

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        return self.agent.read_log(job_id, offset, size)
