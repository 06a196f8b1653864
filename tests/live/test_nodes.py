"""Several nodes' agents behind one (:class:`corral.live.nodes.Nodes`), with real processes on stand-in GPUs:
requests go to the nodes a run holds GPUs on, a job spanning nodes runs as a gang (one process per node, with the
gang environment), and the gang's ranks are one run: started when all are, exited when all are, with the first
failure's exit, taking the other ranks down when one fails or its node is lost; a controller restart adopts an
intact gang and refuses (and clears) a broken one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import corral.live.agent.agent as agent_module
from corral.core import contract
from corral.live.agent import LaunchRequest, ProcessExited, ProcessStarted
from corral.live.agent.gpus import discover_gpus
from corral.live.nodes import NodeDown, NodeReport, Nodes
from corral.live.transport.inprocess import LocalNode

PY = sys.executable
T = TypeVar("T")

PRINT_ENV = (
    "import json, os, sys, time; "
    "keys = ['NODE_RANK', 'NNODES', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', "
    "'CORRAL_GANG_ADDR', 'CORRAL_GANG_PORT', 'CORRAL_GPUS', 'CORRAL_RUN']; "
    "print('ENV ' + json.dumps({k: os.environ.get(k) for k in keys}), flush=True); "
)


class Reports:
    """What the nodes tell the controller, with a wait for one that matches."""

    def __init__(self) -> None:
        self.seen: list[NodeReport] = []
        self._cond = threading.Condition()

    def __call__(self, report: NodeReport) -> None:
        with self._cond:
            self.seen.append(report)
            self._cond.notify_all()

    def wait(self, kind: type[T], pred: Callable[[T], bool] = lambda r: True, timeout_s: float = 20.0) -> T:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for r in self.seen:
                    if isinstance(r, kind) and pred(r):
                        return r
                left = deadline - time.monotonic()
                assert left > 0, f"no {kind.__name__} among {self.seen}"
                self._cond.wait(left)

    def of(self, kind: type[T], job_id: str) -> list[T]:
        with self._cond:
            return [r for r in self.seen if isinstance(r, kind) and getattr(r, "job_id", None) == job_id]


def _nodes(root: Path, count: int = 3) -> tuple[Nodes, Reports]:
    gpus = discover_gpus(stand_in=2)
    members = [LocalNode(f"n{i}", root / f"n{i}", gpus, report_interval_s=0.5) for i in range(count)]
    reports = Reports()
    nodes = Nodes(members, reports)
    nodes.start()
    return nodes, reports


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Nodes, Reports, Path]]:
    nodes, reports = _nodes(tmp_path)
    try:
        yield nodes, reports, tmp_path
    finally:
        nodes.close()
        for pid_file in tmp_path.glob("n*/runs/*/*/pid"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)


def _req(job_id: str, gpus: tuple[int, ...], code: str, run: int = 1) -> LaunchRequest:
    return LaunchRequest(job_id, run, (PY, "-c", code), os.getcwd(), {}, gpus, grace_s=5.0, tenant="t")


def _log(root: Path, node: str, job_id: str) -> Path:
    return root / node / "tenants" / "t" / "logs" / f"{job_id}.log"


def _env_of(root: Path, node: str, job_id: str) -> dict[str, str]:
    for line in _log(root, node, job_id).read_text().splitlines():
        if line.startswith("ENV "):
            env: dict[str, str] = json.loads(line[4:])
            return env
    raise AssertionError(f"no ENV line in {node}'s log of {job_id}")


def test_one_numbering_over_the_nodes(cluster: tuple[Nodes, Reports, Path]) -> None:
    nodes, _, _ = cluster
    assert [g.index for g in nodes.gpus] == [0, 1, 2, 3, 4, 5]
    assert [(name, [g.index for g in gpus]) for name, gpus in nodes.node_gpus()] == [
        ("n0", [0, 1]),
        ("n1", [2, 3]),
        ("n2", [4, 5]),
    ]
    assert [nodes.node_of_gpu(g) for g in range(6)] == ["n0", "n0", "n1", "n1", "n2", "n2"]


def test_a_one_node_job_runs_on_its_node_as_before(cluster: tuple[Nodes, Reports, Path]) -> None:
    nodes, reports, root = cluster
    nodes.launch(_req("solo", (3,), PRINT_ENV))
    exited = reports.wait(ProcessExited, lambda r: r.job_id == "solo")
    assert exited.exit_code == 0
    env = _env_of(root, "n1", "solo")
    assert env["CORRAL_GPUS"] == "1"  # the node's own numbering
    assert env["NNODES"] is None and env["MASTER_ADDR"] is None  # no gang variables
    assert nodes.log_path("solo") == _log(root, "n1", "solo")


def test_a_job_across_nodes_is_one_gang_run(cluster: tuple[Nodes, Reports, Path]) -> None:
    nodes, reports, root = cluster
    nodes.launch(_req("gang", (2, 3, 4, 5), PRINT_ENV + "time.sleep(0.5)"))
    exited = reports.wait(ProcessExited, lambda r: r.job_id == "gang")
    assert exited.exit_code == 0, exited
    assert len(reports.of(ProcessStarted, "gang")) == 1  # once, when both ranks had started
    assert len(reports.of(ProcessExited, "gang")) == 1  # once, when both had exited
    envs = [_env_of(root, n, "gang") for n in ("n1", "n2")]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]  # ranks by node order
    for e in envs:
        assert e["NNODES"] == "2" and e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["CORRAL_GPUS"] == "0,1"
        assert e["MASTER_PORT"] == envs[0]["MASTER_PORT"] and e["CORRAL_GANG_PORT"] == envs[0]["CORRAL_GANG_PORT"]
        assert e["MASTER_PORT"] != e["CORRAL_GANG_PORT"]
    assert not _log(root, "n0", "gang").exists()


def test_a_failed_rank_takes_the_gang_down_with_its_exit(cluster: tuple[Nodes, Reports, Path]) -> None:
    nodes, reports, _ = cluster
    code = "import os, sys, time; time.sleep(60) if os.environ['NODE_RANK'] == '0' else sys.exit(3)"
    started = time.monotonic()
    nodes.launch(_req("bad", (0, 1, 2, 3), code))
    exited = reports.wait(ProcessExited, lambda r: r.job_id == "bad")
    assert time.monotonic() - started < 30  # rank 0 did not sleep its minute out
    assert exited.exit_code == 3 and "rank 1 on node n1" in exited.detail, exited


def test_a_lost_node_ends_its_gangs(cluster: tuple[Nodes, Reports, Path]) -> None:
    nodes, reports, _ = cluster
    nodes.launch(_req("long", (2, 3, 4, 5), "import time; time.sleep(60)"))
    reports.wait(ProcessStarted, lambda r: r.job_id == "long")
    nodes.lose(2, "test")
    assert reports.wait(NodeDown).node == "n2"
    exited = reports.wait(ProcessExited, lambda r: r.job_id == "long")
    assert exited.exit_code is None and "node n2 lost" in exited.detail, exited
    assert nodes.is_down("n2")
    # A run placed on a down node does not start.
    nodes.launch(_req("late", (4,), "pass"))
    late = reports.wait(ProcessExited, lambda r: r.job_id == "late")
    assert "node n2 is down" in late.detail


def test_a_restart_adopts_an_intact_gang_and_clears_a_broken_one(tmp_path: Path) -> None:
    first, reports = _nodes(tmp_path)
    try:
        first.launch(_req("intact", (0, 1, 2, 3), "import time; time.sleep(60)"))
        first.launch(_req("broken", (2, 3, 4, 5), "import time; time.sleep(60)"))
        for job in ("intact", "broken"):
            reports.wait(ProcessStarted, lambda r, j=job: r.job_id == j)  # type: ignore[misc]
        first.close()  # the controller goes; the processes live on
        pid = int((tmp_path / "n2" / "runs" / "broken" / "1" / "spawned").read_text().split()[0])
        os.killpg(pid, signal.SIGKILL)  # one rank of "broken" dies while nobody watches
        for popen in agent_module._DETACHED:  # and is reaped, as it would be with its controller gone
            if popen.pid == pid:
                popen.wait()

        second, reports = _nodes(tmp_path)
        try:
            assert second.adopt("intact", 1, gpus=(0, 1, 2, 3))
            assert not second.adopt("broken", 1, gpus=(2, 3, 4, 5))
            second.cancel("intact", 1)
            assert reports.wait(ProcessExited, lambda r: r.job_id == "intact").requested == "cancel"
            # The broken gang's live rank was stopped: nothing of it is left on n1.
            deadline = time.monotonic() + 20
            while ("broken", 1) in second._nodes[1].agent.processes():  # type: ignore[attr-defined]
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            second.close()
    finally:
        for pid_file in tmp_path.glob("n*/runs/*/*/pid"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)


def test_the_gang_environment_is_the_contracts(cluster: tuple[Nodes, Reports, Path]) -> None:
    assert set(contract.GANG_ENV) >= {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NODE_RANK"}
