"""A gang across nodes obeys each directive at the same step on every rank (:mod:`corral.job.gang`).

Two kinds of tests. With threads: two ranks' :class:`Job` in this process, each with its own stand-in agent
(:class:`AgentPeer`), stepping independently (no collective keeps them together), so that their steps can differ
by much more than a synchronous job's would; directives reach one rank only, or both at different times. With
processes: two real PyTorch DDP ranks (gloo over 127.0.0.1, on the CPU) of ``examples/train_ddp.py``, each
connected to its own agent end, paused, resumed and preempted with directives that reach one rank several steps
after the other, then resumed as fresh processes with the ranks swapped between the "nodes": the final weights
equal an uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from job_agent_peer import AgentPeer, Runner, agent_env, wait_until

from corral.core import contract
from corral.core.errors import ConfigError, InputError
from corral.job import CheckpointStore, GangEnvironment, GangError, Job
from corral.job.checkpoint import read_meta
from corral.job.gang import KIND_DIRECTIVE, MIN_MARGIN_STEPS, Entry, margin_steps

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_ddp.py"
STEP_S = 0.005  # a thread rank's step
LATE_S = 0.15  # how much later the second copy of a directive is sent: many steps of either kind of rank


def free_ports() -> tuple[int, int]:
    """Two distinct free ports (a rendezvous and a gang store). Both sockets are held while the OS picks, so the
    two cannot be the same port (two calls one after the other sometimes got the same one)."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        return a.getsockname()[1], b.getsockname()[1]


def gang_vars(node_rank: int, nnodes: int, master_port: int, gang_port: int) -> dict[str, str]:
    return contract.gang_env(["127.0.0.1"] * nnodes, node_rank, 1, master_port, gang_port)


# -- the gang's environment -------------------------------------------------------------------------------------
def test_gang_env_for_each_rank() -> None:
    nodes = ["10.0.0.5", "10.0.0.7", "10.0.0.9"]
    env = contract.gang_env(nodes, 2, 4, 29500, 29501)
    assert env == {
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "12",
        "NNODES": "3",
        "NODE_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "CORRAL_GANG_ADDR": "10.0.0.5",
        "CORRAL_GANG_PORT": "29501",
    }
    assert set(env) == set(contract.GANG_ENV)
    gang = GangEnvironment.from_env(env)
    assert gang is not None
    assert (gang.rank, gang.size, gang.talks_to_agent) == (2, 3, True)  # one process per node
    assert (gang.master_addr, gang.master_port, gang.world_size) == ("10.0.0.5", 29500, 12)
    # torchrun's worker 3 of 4 on that node: rank 11 of 12 processes, learning the directives through the gang
    worker = GangEnvironment.from_env({**env, "LOCAL_RANK": "3", "RANK": "11"})
    assert worker is not None and (worker.rank, worker.size, worker.talks_to_agent) == (11, 12, False)
    assert GangEnvironment.from_env({}) is None  # a one-node job


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (([], 0, 1, 1, 2), "at least one node"),
        ((["a", ""], 0, 1, 1, 2), "non-empty"),
        ((["a", "b"], 2, 1, 1, 2), "node_rank 2"),
        ((["a"], 0, 0, 1, 2), "gpus_per_node"),
        ((["a"], 0, 1, 0, 2), "master_port 0"),
        ((["a"], 0, 1, 1, 70000), "gang_port 70000"),
        ((["a"], 0, 1, 5, 5), "must differ"),
    ],
)
def test_gang_env_refuses_what_no_gang_has(args: tuple[list[str], int, int, int, int], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        contract.gang_env(*args)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"CORRAL_GANG_PORT": "x"}, "CORRAL_GANG_PORT='x': expected an integer"),
        ({"CORRAL_GANG_PORT": "0"}, "from 1 to 65535"),
        ({"NNODES": None}, "NNODES is not set"),
        ({"NODE_RANK": "2"}, "NODE_RANK='2': expected an integer from 0 to 1"),
        ({"LOCAL_RANK": "1"}, "RANK is not set, but LOCAL_RANK is"),
        ({"LOCAL_RANK": "1", "RANK": "2"}, "RANK='2': expected an integer from 0 to 1"),
        ({"LOCAL_RANK": "1", "WORLD_SIZE": None}, "WORLD_SIZE is not set, but LOCAL_RANK is"),
        ({"CORRAL_GANG_ADDR": None, "MASTER_ADDR": None}, "CORRAL_GANG_ADDR (or MASTER_ADDR) is not set"),
    ],
)
def test_a_malformed_gang_environment_stops_the_job_at_start(change: dict[str, str | None], words: str) -> None:
    env = gang_vars(1, 2, 29500, 29501)
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(ConfigError, match=re.escape(words)):
        Job(env=env, handle_sigterm=False)


def test_every_directive_carries_an_optional_seq() -> None:
    directives: list[contract.Message] = [
        contract.Pause("slice", evict=True, seq=3),
        contract.Resume(seq=4),
        contract.Checkpoint("preempted", seq=5),
        contract.SetBatchSize(64, seq=6),
        contract.SetLimits(gpu_milli=500, seq=7),
    ]
    for message in directives:
        assert contract.decode(contract.encode(message)) == message
    assert contract.decode(b'{"type": "resume"}') == contract.Resume(seq=None)  # a one-node job's
    for bad in (-1, 1.5, "3", True, 2**60):
        with pytest.raises(InputError) as caught:
            contract.decode(json.dumps({"type": "pause", "seq": bad}))
        assert caught.value.column == "seq"


def test_the_margin_is_fifty_milliseconds_of_steps() -> None:
    assert margin_steps(0.01) == 5
    assert margin_steps(0.5) == MIN_MARGIN_STEPS
    assert margin_steps(0.0) == MIN_MARGIN_STEPS  # no step timed yet
    assert margin_steps(1e-9) == 10_000


# -- two ranks on threads -----------------------------------------------------------------------------------------
class ThreadGang:
    """Two ranks' Jobs in this process, each with its own agent end; rank 0 first (it hosts the store)."""

    def __init__(
        self,
        tmp: Path,
        *,
        checkpoint_dir: Path | None = None,
        job_args: Callable[[int], dict[str, object]] = lambda rank: {},
    ) -> None:
        gang_port, master_port = free_ports()
        self.peers = [AgentPeer(str(tmp / f"agent{r}.sock")) for r in range(2)]
        extra = {contract.ENV_CHECKPOINT_DIR: str(checkpoint_dir)} if checkpoint_dir is not None else {}
        self.jobs: list[Job] = []
        for r in range(2):
            env = agent_env(self.peers[r], job_id="gang") | extra | gang_vars(r, 2, master_port, gang_port)
            self.jobs.append(Job(env=env, handle_sigterm=False, **job_args(r)))  # type: ignore[arg-type,unused-ignore]
        self.stop = threading.Event()
        self.runners: list[Runner] = []

    def run(self, rank: int, gate: threading.Event | None = None) -> Runner:
        """Start ``rank``'s training loop: steps of STEP_S until stopped; each step waits for ``gate``, if given."""
        job = self.jobs[rank]

        def body() -> None:
            for _ in job.loop(itertools.count()):
                if gate is not None:
                    gate.wait()
                if self.stop.is_set():
                    break
                time.sleep(STEP_S)

        runner = Runner(body)
        self.runners.append(runner)
        return runner

    def close(self) -> None:
        self.stop.set()
        for runner in self.runners:
            with contextlib.suppress(AssertionError):
                runner.thread.join(timeout=15)
        for job in reversed(self.jobs):  # rank 0 last: it waits for the others to close
            job.close()
        for peer in self.peers:
            peer.stop()


@pytest.fixture
def thread_gang(short_tmp: Path) -> Iterator[Callable[..., ThreadGang]]:
    made: list[ThreadGang] = []

    def make(**kwargs: object) -> ThreadGang:
        gang = ThreadGang(short_tmp, **kwargs)  # type: ignore[arg-type]
        made.append(gang)
        return gang

    yield make
    for gang in made:
        gang.close()


def agreed(job: Job) -> list[Entry]:
    """The entries the job's gang has applied, in order, with their proposed and agreed steps."""
    assert job._gang is not None
    return list(job._gang.agreed)


def stands_still(jobs: list[Job], for_s: float = 0.15) -> bool:
    before = [j.global_step for j in jobs]
    time.sleep(for_s)
    return [j.global_step for j in jobs] == before


def test_a_directive_that_reaches_one_rank_only_pauses_and_resumes_both_at_one_step(
    thread_gang: Callable[..., ThreadGang],
) -> None:
    g = thread_gang()
    g.run(0), g.run(1)
    for peer in g.peers:
        peer.expect(contract.StepReport)
    g.peers[1].send(contract.Pause(reason="time slice", seq=1))  # rank 0's agent never sends it
    paused = [peer.expect(contract.Paused) for peer in g.peers]
    assert paused[0].step == paused[1].step == g.jobs[0].global_step == g.jobs[1].global_step
    assert all(j.paused for j in g.jobs) and stands_still(g.jobs)
    g.peers[0].send(contract.Resume(seq=2))  # and this one only rank 0's
    resumed = [peer.expect(contract.Resumed) for peer in g.peers]
    assert resumed[0].step == resumed[1].step == paused[0].step
    for peer in g.peers:
        peer.expect(contract.StepReport, lambda r: r.step > paused[0].step)
    entry = agreed(g.jobs[0])[0]
    assert (entry.key, entry.by, entry.agreed) == ("seq:1", 1, paused[0].step)


def test_copies_arriving_steps_apart_are_one_directive(thread_gang: Callable[..., ThreadGang]) -> None:
    calls: list[list[tuple[int, int]]] = [[], []]

    def hook(rank: int) -> Callable[[int], int | None]:
        def on_batch_size(n: int) -> None:
            calls[rank].append((n, g.jobs[rank].global_step))

        return on_batch_size

    g = thread_gang(job_args=lambda rank: {"batch_size": 32, "on_batch_size": hook(rank)})
    g.run(0), g.run(1)
    for peer in g.peers:
        peer.expect(contract.StepReport)
    g.peers[0].send(contract.SetBatchSize(batch_size=48, seq=7))
    time.sleep(LATE_S)  # some 30 steps later: the gang applied it already
    g.peers[1].send(contract.SetBatchSize(batch_size=48, seq=7))
    for peer in g.peers:
        peer.expect(contract.StepReport, lambda r: r.batch_size == 48)
    g.peers[0].send(contract.SetBatchSize(batch_size=48, seq=7))  # the controller sent it again
    g.peers[1].send(contract.SetBatchSize(batch_size=64, seq=8))
    for peer in g.peers:
        peer.expect(contract.StepReport, lambda r: r.batch_size == 64)
    assert [n for n, _ in calls[0]] == [n for n, _ in calls[1]] == [48, 64]
    assert calls[0] == calls[1]  # each at the same step on both ranks


def test_a_rank_far_ahead_moves_the_agreed_step_later_never_past_it(thread_gang: Callable[..., ThreadGang]) -> None:
    g = thread_gang()
    gate = threading.Event()
    g.run(0, gate), g.run(1)
    wait_until(lambda: g.jobs[1].global_step >= 40)  # rank 1 is some 40 steps ahead of rank 0, held in its first
    g.peers[0].send(contract.Pause(seq=1))
    wait_until(lambda: len(g.jobs[0]._inbox) == 1)
    gate.set()  # rank 0 proposes at its next boundary, for its step + the margin, far behind rank 1
    paused = [peer.expect(contract.Paused) for peer in g.peers]
    assert paused[0].step == paused[1].step
    entry = agreed(g.jobs[0])[0]
    assert entry.by == 0 and entry.proposed < 40 <= entry.agreed == paused[0].step
    g.peers[1].send(contract.Resume(seq=2))
    for peer in g.peers:
        peer.expect(contract.Resumed)


def test_a_paused_gang_takes_its_next_directive_where_it_is_paused(thread_gang: Callable[..., ThreadGang]) -> None:
    """A directive proposed for a step beyond the pause (its proposer was a few steps short of the pause when it
    asked) applies where the gang is paused: the gang would otherwise wait for that step forever."""
    g = thread_gang()
    g.run(0), g.run(1)
    for peer in g.peers:
        peer.expect(contract.StepReport)
    g.peers[0].send(contract.Pause(seq=1))
    paused = [peer.expect(contract.Paused) for peer in g.peers]
    gang = g.jobs[1]._gang
    assert gang is not None
    gang.propose("seq:2", KIND_DIRECTIVE, contract.Resume(seq=2), paused[0].step + 1000)
    resumed = [peer.expect(contract.Resumed) for peer in g.peers]
    assert paused[0].step == paused[1].step == resumed[0].step == resumed[1].step
    assert [(e.key, e.agreed) for e in gang.agreed] == [("seq:1", paused[0].step), ("seq:2", paused[0].step)]
    for peer in g.peers:
        peer.expect(contract.StepReport, lambda r: r.step > paused[0].step + 5)


def test_pause_and_resume_in_quick_succession_to_both_ranks(thread_gang: Callable[..., ThreadGang]) -> None:
    g = thread_gang()
    g.run(0), g.run(1)
    for peer in g.peers:
        peer.expect(contract.StepReport)
    for seq in range(1, 21, 2):  # ten pauses, each resumed at once, sent to rank 0 first, then to rank 1
        for peer in g.peers:
            peer.send(contract.Pause(seq=seq))
            peer.send(contract.Resume(seq=seq + 1))
    gang = g.jobs[0]._gang
    assert gang is not None
    wait_until(lambda: len(gang.agreed) == 20)
    at = max(j.global_step for j in g.jobs)
    for peer in g.peers:  # nobody stuck
        peer.expect(contract.StepReport, lambda r: r.step > at + 5)
    for kind in (contract.Paused, contract.Resumed):  # the same pauses on both ranks, at the same steps
        steps0, steps1 = ([m.step for m in peer.received(kind)] for peer in g.peers)
        assert steps0 == steps1


def test_checkpoint_and_exit_rank_0_writes_the_other_waits_for_it(
    thread_gang: Callable[..., ThreadGang], tmp_path: Path
) -> None:
    g = thread_gang(checkpoint_dir=tmp_path / "ckpt")
    runners = [g.run(0), g.run(1)]
    for peer in g.peers:
        peer.expect(contract.StepReport)
    g.peers[1].send(contract.Pause(seq=1))
    paused = [peer.expect(contract.Paused) for peer in g.peers]
    g.peers[0].send(contract.Checkpoint(reason="preempted", seq=2))  # to a paused gang, through rank 0 only
    done = [peer.expect(contract.Checkpointed) for peer in g.peers]
    assert [r.join() for r in runners] == [contract.EXIT_PREEMPTED] * 2
    assert done[0].step == done[1].step == paused[0].step
    assert done[0].path == done[1].path == str(CheckpointStore(tmp_path / "ckpt").latest())
    meta = read_meta(Path(done[0].path))
    assert meta["gang_size"] == 2 and set(meta["ranks"]) == {"1"}  # rank 1's generator states, beside rank 0's
    assert g.peers[0].received(contract.Resumed) == g.peers[1].received(contract.Resumed) == []


def test_one_ranks_request_checkpoints_the_gang_and_it_goes_on(
    thread_gang: Callable[..., ThreadGang], tmp_path: Path
) -> None:
    g = thread_gang(checkpoint_dir=tmp_path / "ckpt")
    g.run(0), g.run(1)
    wait_until(lambda: g.jobs[1].global_step >= 5)
    g.jobs[1].request_checkpoint(exit=False)  # only rank 1 asks: rank 0 writes it
    wait_until(lambda: g.jobs[0].checkpoint_path is not None)
    latest = CheckpointStore(tmp_path / "ckpt").latest()
    assert latest is not None and g.jobs[0].checkpoint_path == latest
    step = read_meta(latest)["step"]
    wait_until(lambda: min(j.global_step for j in g.jobs) > step + 5)  # both go on
    assert all(j.preempt_requested is None for j in g.jobs)


def test_torchrun_workers_learn_the_directives_from_the_worker_that_talks_to_the_agent(short_tmp: Path) -> None:
    """One node, two workers started by torchrun (LOCAL_RANK 0 and 1): only worker 0 connects to the agent."""
    peer = AgentPeer(str(short_tmp / "agent.sock"))
    env = agent_env(peer, job_id="tr") | gang_vars(0, 1, *free_ports())
    env |= {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}  # as torchrun --nproc_per_node 2 sets them
    jobs = [Job(env=env | {"LOCAL_RANK": str(r), "RANK": str(r)}, handle_sigterm=False) for r in range(2)]
    stop = threading.Event()

    def body(job: Job) -> Callable[[], None]:
        def run() -> None:
            for _ in job.loop(itertools.count()):
                if stop.is_set():
                    break
                time.sleep(STEP_S)

        return run

    runners = [Runner(body(job)) for job in jobs]
    try:
        assert [j.gang.rank for j in jobs if j.gang] == [0, 1] and jobs[1].standalone and not jobs[0].standalone
        peer.expect(contract.StepReport)
        peer.send(contract.Pause(seq=1))
        paused = peer.expect(contract.Paused)
        wait_until(lambda: jobs[1].paused)
        assert jobs[0].global_step == jobs[1].global_step == paused.step and stands_still(jobs)
        peer.send(contract.Resume(seq=2))
        peer.expect(contract.Resumed)
        wait_until(lambda: min(j.global_step for j in jobs) > paused.step + 5)
        assert len(peer.received(contract.Hello)) == 1 and len(peer.received(contract.Paused)) == 1
    finally:
        stop.set()
        for runner in runners:
            runner.join()
        for job in reversed(jobs):
            job.close()
        peer.stop()


def test_directives_without_seq_are_still_agreed(
    thread_gang: Callable[..., ThreadGang], caplog: pytest.LogCaptureFixture
) -> None:
    g = thread_gang()
    g.run(0), g.run(1)
    for peer in g.peers:
        peer.expect(contract.StepReport)
    g.peers[0].send(contract.Pause())
    paused = [peer.expect(contract.Paused) for peer in g.peers]
    g.peers[1].send(contract.Resume())
    resumed = [peer.expect(contract.Resumed) for peer in g.peers]
    assert paused[0].step == paused[1].step == resumed[0].step == resumed[1].step
    assert "without seq" in caplog.text


def test_ranks_that_start_at_different_steps_stop(short_tmp: Path, tmp_path: Path) -> None:
    """Rank 1 found a checkpoint that rank 0 does not see (the directory is not shared): neither trains."""
    with Job(checkpoint_dir=tmp_path / "one", env={}) as alone:
        for _ in alone.loop(range(5)):
            pass
        alone.request_checkpoint(exit=False)
        with alone.step():
            pass
    ports = free_ports()
    dirs = [tmp_path / "empty", tmp_path / "one"]
    jobs = [Job(env=gang_vars(r, 2, *ports), checkpoint_dir=dirs[r], handle_sigterm=False) for r in range(2)]
    assert [j.global_step for j in jobs] == [0, 5]

    def first_step(job: Job) -> Callable[[], None]:
        return lambda: next(iter(job.loop(range(3)))) and None

    runners = [Runner(first_step(job)) for job in jobs]
    for runner in runners:
        with pytest.raises(GangError, match=r"rank 0: 0, rank 1: 5.*CORRAL_CHECKPOINT_DIR"):
            runner.join()
    for job in reversed(jobs):
        job.close()


# -- two DDP ranks in processes ------------------------------------------------------------------------------------
DDP_ARGS = ["--epochs", "3", "--steps-per-epoch", "40", "--batch-size", "8", "--dist-timeout-s", "60"]  # 120 steps


def start_rank(
    rank: int, ports: tuple[int, int], *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    base["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, so that runs are comparable bit for bit
    base["OMP_NUM_THREADS"] = "1"
    master_port, gang_port = ports
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *DDP_ARGS, *extra],
        env=base | gang_vars(rank, 2, master_port, gang_port) | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish_all(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=timeout)
        out.append((proc.returncode, text))
    return out


@contextlib.contextmanager
def killed_at_end(procs: list[subprocess.Popen[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def send_if_connected(peer: AgentPeer, message: contract.Message) -> None:
    conn = peer._conn
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.sendall(contract.encode(message))


def weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def test_ddp_ranks_pause_resume_and_checkpoint_at_one_step_then_resume_swapped_bit_exact(
    short_tmp: Path, tmp_path: Path
) -> None:
    # An uninterrupted run of the same gang (no agents) gives the reference weights.
    reference = tmp_path / "reference.pt"
    ports = free_ports()
    with killed_at_end([start_rank(r, ports, "--save-weights", str(reference)) for r in range(2)]) as procs:
        results = finish_all(procs)
    assert [code for code, _ in results] == [0, 0], results
    assert "rank 0 done: 120 steps" in results[0][1]

    ckpt = str(tmp_path / "ckpt")
    out = tmp_path / "weights.pt"
    peers = [AgentPeer(str(short_tmp / f"node{n}.sock")) for n in range(2)]  # node n's agent
    try:
        # Run 1: rank r on node r. Each directive reaches one rank LATE_S (some 15 steps) after the other.
        ports = free_ports()
        envs = [agent_env(peers[n], job_id="ddp", run=1, **{contract.ENV_CHECKPOINT_DIR: ckpt}) for n in range(2)]
        with killed_at_end([start_rank(n, ports, "--step-sleep", "0.01", env=envs[n]) for n in range(2)]) as procs:
            for peer in peers:
                peer.expect(contract.StepReport, lambda r: r.step >= 10, timeout=120)
            peers[0].send(contract.Pause(reason="time slice", seq=1))
            time.sleep(LATE_S)
            peers[1].send(contract.Pause(reason="time slice", seq=1))
            paused = [peer.expect(contract.Paused) for peer in peers]
            assert paused[0].step == paused[1].step
            time.sleep(0.3)  # both stand still: no step past the pause in 30 steps' time
            for peer in peers:
                assert all(r.step <= paused[0].step for r in peer.received(contract.StepReport))
            peers[1].send(contract.Resume(seq=2))
            time.sleep(LATE_S)
            peers[0].send(contract.Resume(seq=2))
            resumed = [peer.expect(contract.Resumed) for peer in peers]
            assert resumed[0].step == resumed[1].step == paused[0].step
            for peer in peers:
                peer.expect(contract.StepReport, lambda r: r.step >= paused[0].step + 10)
            peers[1].send(contract.Checkpoint(reason="preempted", seq=3))
            time.sleep(LATE_S)
            # By now both ranks have most likely checkpointed and exited: the late copy finds nobody, or a job
            # that has the directive already.
            send_if_connected(peers[0], contract.Checkpoint(reason="preempted", seq=3))
            done = [peer.expect(contract.Checkpointed) for peer in peers]
            results = finish_all(procs)
        assert [code for code, _ in results] == [contract.EXIT_PREEMPTED] * 2, results
        assert done[0].step == done[1].step < 120
        assert done[0].path == done[1].path == str(CheckpointStore(ckpt).latest())
        assert not out.exists()

        # Run 2: fresh processes, the ranks swapped between the nodes (node 0 now runs rank 1); both resume from
        # rank 0's checkpoint, each with its own generator states, and finish.
        ports = free_ports()
        for env in envs:
            env[contract.ENV_RUN] = "2"
        with killed_at_end(
            [start_rank(1 - n, ports, "--save-weights", str(out), env=envs[n]) for n in range(2)]
        ) as procs:
            results = finish_all(procs)
        assert [code for code, _ in results] == [0, 0], results
        for _, text in results:
            assert f"resumed at step {done[0].step}" in text
        assert peers[0].expect(contract.Hello, lambda h: h.run == 2).pid == procs[0].pid
    finally:
        for peer in peers:
            peer.stop()
    final, ref = weights(out), weights(reference)
    assert final.keys() == ref.keys()
    for name in ref:
        assert torch.equal(final[name], ref[name]), f"{name} differs from the uninterrupted run"
    assert json.loads(json.dumps(read_meta(Path(done[0].path))["ranks"]))["1"]["now"]  # rank 1's own states
