"""corral's live mode on a Ray cluster (issue 14): one Ray cluster of three fake nodes with two logical GPUs each
(``ray.cluster_utils.Cluster``, on the loopback interface), shared by the module. A job larger than a node runs as a
gang across nodes with the gang environment; a node removed mid-run requeues its jobs, which finish elsewhere, and
its GPUs are used again once it is back; a ``kill -9`` of the controller loses nothing and runs nothing twice.

Skipped when Ray is not installed (``pip install 'corral[ray]'``; ``.ci/run`` installs it)."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Ray reads this when it is imported: keep the test cluster on 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'corral[ray]'")

from corral.core.errors import ConfigError  # noqa: E402
from corral.core.job import JobPhase  # noqa: E402
from corral.live.client import Client  # noqa: E402
from corral.live.config import ServeConfig, TenantConfig  # noqa: E402
from corral.live.controller import Controller  # noqa: E402
from corral.live.records import JobRequest  # noqa: E402
from corral.live.transport.ray import NODE_LABEL  # noqa: E402
from live_server import start_server, stop_server  # noqa: E402

PY = sys.executable

PRINT_ENV = (
    "import json, os, time; "
    "keys = ['NODE_RANK', 'NNODES', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'CORRAL_GPUS']; "
    "print('ENV ' + json.dumps({k: os.environ.get(k) for k in keys}), flush=True); "
)


class RayNodes:
    """The module's Ray cluster: a head without GPUs and three nodes of two GPUs, labelled node0..node2."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "node_ip_address": "127.0.0.1"}
        )
        self.nodes: dict[str, Any] = {}
        for i in range(3):
            self.add(f"node{i}")
        ray.init(address=self.cluster.address, namespace="corral", logging_level="ERROR", log_to_driver=False)

    def add(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, num_gpus=2, node_ip_address="127.0.0.1", labels={NODE_LABEL: name}
        )

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name))

    def close(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[RayNodes]:
    nodes = RayNodes()
    try:
        yield nodes
    finally:
        nodes.close()


def _until(cond: Callable[[], bool], timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            faulthandler.dump_traceback(all_threads=True)  # where the controller's threads are, for the report
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def _kill_runs(state_dir: Path) -> None:
    for pid_file in state_dir.glob("nodes/*/runs/*/*/spawned"):
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)


@pytest.fixture
def controller(ray_nodes: RayNodes, tmp_path: Path) -> Iterator[Controller]:
    config = ServeConfig(
        state_dir=tmp_path / "state",
        ray=ray_nodes.cluster.address,
        tenants=(TenantConfig("alice", None),),
        grace_s=5.0,
        policy="fifo",
    )
    c = Controller.from_config(config)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        _kill_runs(tmp_path / "state")
        for name in list(ray_nodes.nodes):  # the next test finds fresh agents
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(f"corral-agent-{name}", namespace="corral"))


def _request(code: str, num_gpus: int = 1) -> JobRequest:
    return JobRequest(command=(PY, "-c", code), tenant="alice", cwd=os.getcwd(), num_gpus=num_gpus)


def _env_lines(path: Path) -> list[dict[str, str]]:
    return [json.loads(line[4:]) for line in path.read_text().splitlines() if line.startswith("ENV ")]


def test_a_warm_job_on_a_ray_node_is_forked_from_that_nodes_zygote(ray_nodes: RayNodes, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="warm starts are for scripts that use torch (pip install corral[torch])")
    config = ServeConfig(
        state_dir=tmp_path / "state",
        ray=ray_nodes.cluster.address,
        tenants=(TenantConfig("alice", None),),
        grace_s=5.0,
        policy="fifo",
        warm_starts=True,
    )
    c = Controller.from_config(config)
    c.start()
    try:
        script = tmp_path / "warm.py"
        script.write_text("import sys\nprint('torch already:', 'torch' in sys.modules)\n")
        zlogs = lambda: list((tmp_path / "state" / "nodes").glob("*/zygote.log"))  # noqa: E731
        _until(lambda: len(zlogs()) == 3 and all("imported" in z.read_text() for z in zlogs()), 120, "3 zygotes")
        job = c.submit(
            JobRequest(
                command=(PY, str(script)), tenant="alice", cwd=os.getcwd(), warm=True, env={"PATH": os.environ["PATH"]}
            )
        )
        _until(lambda: c.job(job.job_id).phase is JobPhase.FINISHED, what="the warm job finished")
        log, _ = c.read_log(job.job_id, 0, 1 << 20)
        assert b"torch already: True" in log and b"started cold" not in log, log
    finally:
        c.stop()
        _kill_runs(tmp_path / "state")
        for name in list(ray_nodes.nodes):  # the next test finds fresh agents (without zygotes)
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(f"corral-agent-{name}", namespace="corral"))


def test_a_job_larger_than_a_node_runs_as_a_gang_across_nodes(controller: Controller, tmp_path: Path) -> None:
    snap = controller.cluster()
    assert snap.num_gpus == 6
    assert sorted({g.node for g in snap.gpus}) == ["node0", "node1", "node2"]
    job = controller.submit(_request(PRINT_ENV, num_gpus=4))
    _until(lambda: controller.job(job.job_id).phase is JobPhase.FINISHED, what="the gang finished")
    rec = controller.job(job.job_id)
    assert rec.process.run == 1 and rec.status.placement is None
    logs = sorted((tmp_path / "state" / "nodes").glob(f"*/tenants/alice/logs/{job.job_id}.log"))
    assert len(logs) == 2  # one rank on each of two nodes
    envs = sorted((e for log in logs for e in _env_lines(log)), key=lambda e: e["NODE_RANK"])
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert all(e["NNODES"] == "2" and e["WORLD_SIZE"] == "4" and e["MASTER_ADDR"] == "127.0.0.1" for e in envs)
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    # The log the API shows is rank 0's, read by its node's agent actor (logs stay on their node).
    rank0 = next(log for log in logs if _env_lines(log)[0]["NODE_RANK"] == "0")
    data, size = controller.read_log(job.job_id, 0, 1 << 20)
    assert data == rank0.read_bytes() and size == len(data)
    tail, _ = controller.read_log(job.job_id, 10, 5)
    assert tail == data[10:15]


def test_a_lost_node_requeues_its_jobs_and_its_gpus_come_back(
    controller: Controller, ray_nodes: RayNodes, tmp_path: Path
) -> None:
    long = "import os, time; time.sleep(120 if os.environ['CORRAL_RUN'] == '1' else 1)"
    jobs = [controller.submit(_request(long, num_gpus=2)) for _ in range(2)]
    _until(lambda: all(controller.job(j.job_id).process.phase.value == "running" for j in jobs), what="started")
    gpus = controller.cluster().gpus
    on_node = {}
    for j in jobs:
        placement = controller.job(j.job_id).status.placement
        assert placement is not None
        on_node[j.job_id] = gpus[placement.gpus[0]].node
    victim = jobs[0].job_id
    lost = on_node[victim]
    t0 = time.monotonic()
    ray_nodes.remove(lost)
    _until(lambda: controller.job(victim).status.preemptions >= 1, what="requeued")
    requeued_s = time.monotonic() - t0
    _until(lambda: controller.job(victim).phase is JobPhase.FINISHED, what="finished elsewhere")
    rec = controller.job(victim)
    assert rec.process.run == 2
    assert requeued_s < 30, requeued_s
    assert lost in [n.name for n in controller.cluster().nodes if n.state == "lost"]

    ray_nodes.add(lost)
    _until(lambda: all(n.state == "alive" for n in controller.cluster().nodes), what="the node is back")
    fill = [controller.submit(_request("import time; time.sleep(2)", num_gpus=2)) for _ in range(3)]
    _until(lambda: all(controller.job(j.job_id).phase is JobPhase.FINISHED for j in fill), what="fill ran")
    used = {controller.cluster().gpus[g].node for j in fill for g in _gpus_of(controller, j.job_id)}
    assert lost in used


def test_a_node_declared_to_join_later_is_lost_until_it_comes_then_used(ray_nodes: RayNodes, tmp_path: Path) -> None:
    """``ray_expect``: node7 is part of the cluster model from the start (8 GPUs), lost until a Ray node labelled
    node7 with two GPUs is alive; a job needing all 8 waits for it, then runs with node7's GPUs."""
    config = ServeConfig(
        state_dir=tmp_path / "state",
        ray=ray_nodes.cluster.address,
        ray_expect=("node7:2",),
        tenants=(TenantConfig("alice", None),),
        grace_s=5.0,
        policy="fifo",
    )
    c = Controller.from_config(config)
    c.start()
    try:
        snap = c.cluster()
        assert snap.num_gpus == 8
        _until(lambda: {n.name: n.state for n in c.cluster().nodes}["node7"] == "lost", what="node7 counted lost")
        job = c.submit(_request("import time; time.sleep(1)", num_gpus=8))
        time.sleep(2)
        assert c.job(job.job_id).phase is JobPhase.PENDING  # 6 GPUs alive
        ray_nodes.add("node7")
        _until(lambda: c.job(job.job_id).phase is JobPhase.FINISHED, what="the 8-GPU job ran once node7 came")
        assert {n.name: n.state for n in c.cluster().nodes}["node7"] == "alive"
        assert "node7" in {c.cluster().gpus[g].node for g in _gpus_of(c, job.job_id)}
    finally:
        c.stop()
        _kill_runs(tmp_path / "state")
        if "node7" in ray_nodes.nodes:
            ray_nodes.remove("node7")
        for name in ["node7", *ray_nodes.nodes]:
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(f"corral-agent-{name}", namespace="corral"))


def test_a_declared_node_needs_a_known_gpu_type(ray_nodes: RayNodes, tmp_path: Path) -> None:
    config = ServeConfig(state_dir=tmp_path / "state", ray=ray_nodes.cluster.address, ray_expect=("node8:2:A100-80GB",))
    with pytest.raises(ConfigError, match="no node present has GPU type 'A100-80GB'"):
        Controller.from_config(config)


def _gpus_of(controller: Controller, job_id: str) -> list[int]:
    for event in controller.events(job_id):
        if event.kind == "launched":
            return [int(g) for g in event.detail.split("GPUs ")[1].split(" ")[0].split(",")]
    return []


def test_kill_9_of_the_controller_loses_nothing_and_runs_nothing_twice(ray_nodes: RayNodes, tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ("--ray", ray_nodes.cluster.address)
    server = start_server(state, *args)
    try:
        client = Client(server.url, (state / "admin.token").read_text().strip())
        code = "import os, time; print('run', os.environ['CORRAL_RUN'], flush=True); time.sleep(8)"
        jobs = [client.submit([PY, "-c", code], num_gpus=n) for n in (4, 1, 1, 2)]
        _until(lambda: sum(client.job(j["job_id"])["process"]["phase"] == "running" for j in jobs) >= 3)
    finally:
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
    server = start_server(state, *args)
    try:
        client = Client(server.url, (state / "admin.token").read_text().strip())
        for j in jobs:
            _until(lambda j=j: client.job(j["job_id"])["phase"] == "finished", what=j["job_id"])  # type: ignore[misc]
        assert [client.job(j["job_id"])["process"]["run"] for j in jobs] == [1, 1, 1, 1]
    finally:
        stop_server(server)
        _kill_runs(state)


def test_an_unreachable_ray_address_is_a_clear_error_at_once(tmp_path: Path) -> None:

    from live_server import free_port

    t0 = time.monotonic()
    config = ServeConfig(state_dir=tmp_path / "state", ray=f"127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match=r"cannot reach the Ray cluster at '127\.0\.0\.1:"):
        Controller.from_config(config)
    assert time.monotonic() - t0 < 30


def test_a_second_controller_on_the_same_ray_cluster_is_refused(controller: Controller, tmp_path: Path) -> None:

    from corral.live.transport.ray import RayCluster, RayOptions

    assert controller.cluster().num_gpus == 6
    other = RayCluster(RayOptions(ray.get_runtime_context().gcs_address, str(tmp_path / "other")))
    with pytest.raises(ConfigError, match="another corral controller"):
        other.connect()


def test_a_ddp_gang_whose_node_is_lost_restarts_on_other_nodes_with_the_uninterrupted_weights(
    ray_nodes: RayNodes, tmp_path: Path
) -> None:
    """A 4-GPU PyTorch DDP job (gloo over 127.0.0.1, one rank per node, through corral.job) loses a node while it
    trains: its other rank is stopped (it would hang in its next all-reduce), the job is requeued and runs again on
    another pair of nodes, and its final weights equal an uninterrupted run's. (Resuming a gang from rank 0's
    checkpoint with the ranks on other nodes is tested bit for bit in tests/job/test_gang.py.)"""
    torch = pytest.importorskip("torch", reason="the DDP example needs torch")
    examples = Path(__file__).resolve().parents[2] / "examples"
    config = ServeConfig(
        state_dir=tmp_path / "state", ray=ray_nodes.cluster.address, tenants=(TenantConfig("alice", None),)
    )
    c = Controller.from_config(config)
    c.start()

    def ddp(weights: Path) -> JobRequest:
        argv = ("train_ddp.py", "--epochs", "3", "--steps-per-epoch", "100", "--step-sleep", "0.05")
        command = (PY, *argv, "--save-weights", str(weights))
        return JobRequest(command=command, tenant="alice", cwd=str(examples), num_gpus=4)

    def phase(job_id: str) -> JobPhase:
        return c.job(job_id).phase

    try:
        ref = c.submit(ddp(tmp_path / "ref.pt"))
        _until(lambda: phase(ref.job_id) is JobPhase.FINISHED, 300, "the uninterrupted run")

        job = c.submit(ddp(tmp_path / "again.pt"))
        _until(lambda: c.job(job.job_id).telemetry is not None, 180, "the gang trains")  # a step report came
        nodes_before = {c.cluster().gpus[g].node for g in _gpus_of(c, job.job_id)}
        assert len(nodes_before) == 2
        lost = sorted(nodes_before)[0]
        ray_nodes.remove(lost)
        _until(lambda: phase(job.job_id) is JobPhase.FINISHED, 400, "the run on the nodes left")
        rec = c.job(job.job_id)
        assert rec.process.run == 2 and rec.status.preemptions == 1
        assert any(e.kind == "node lost" for e in c.events(job.job_id))
        last = [e for e in c.events(job.job_id) if e.kind == "launched"][-1]
        gpus_after = [int(g) for g in last.detail.split("GPUs ")[1].split(" ")[0].split(",")]
        nodes_after = {c.cluster().gpus[g].node for g in gpus_after}
        assert lost not in nodes_after and len(nodes_after) == 2
        ref_w = torch.load(tmp_path / "ref.pt")
        got_w = torch.load(tmp_path / "again.pt")
        assert ref_w.keys() == got_w.keys()
        for k in ref_w:
            assert torch.equal(ref_w[k], got_w[k]), k
    finally:
        c.stop()
        _kill_runs(tmp_path / "state")
        for name in ("node0", "node1", "node2"):
            if name not in ray_nodes.nodes:
                ray_nodes.add(name)
