"""AntMan in live mode, end to end on a stand-in GPU, with real processes and real PyTorch.

The controller's AntMan policy shrinks an opportunistic job's GPU memory when a guaranteed job arrives; the job
(``examples/train_mlp.py``, whose steps go through ``corral.job``'s ``train_step``) degrades down its memory ladder
instead of failing, and climbs back when the guaranteed job leaves. With ``reclaim=preempt`` the opportunistic job
is suspended instead: it moves its state to host memory, gives the GPU memory back, and resumes in place.

The stand-in GPU's memory is modelled inside the job by ``corral.job.SimulatedDevice`` (``--simulated-gpu-mib``),
so a cap has a real effect on a machine without a GPU: the job's ladder reacts to PyTorch's own out-of-memory
error, as it would on CUDA.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_controller import shutdown, wait_phase, wait_until

from corral.core.job import JobPhase
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.records import JobRequest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_mlp.py"
GPU_MIB = 64


@pytest.fixture(params=["antman:mem_margin_mib=1"])
def controller(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Controller]:
    config = ServeConfig(
        state_dir=tmp_path / "state",
        gpus=1,
        stand_in_mem_mib=GPU_MIB,
        tenants=(TenantConfig("alice", 1), TenantConfig("bob", 0)),
        grace_s=5.0,
        policy=request.param,
    )
    c = Controller.from_config(config)
    c.start()
    yield c
    shutdown(c)


def submit_bob(controller: Controller) -> str:
    """An opportunistic training job on a modelled 64 MiB GPU; its full batch needs about 27 MiB."""
    bob = controller.submit(
        JobRequest(
            command=(
                sys.executable,
                str(EXAMPLE),
                *("--epochs", "1000", "--steps-per-epoch", "100", "--step-sleep", "0.01"),
                *("--hidden", "1024", "--batch-size", "1024", "--simulated-gpu-mib", str(GPU_MIB)),
            ),
            tenant="bob",
            cwd=str(EXAMPLE.parent),
            gpu_mem_mib=30,
            opportunistic=True,
        )
    )
    wait_phase(controller, bob.job_id, JobPhase.RUNNING)
    assert wait_until(lambda: controller.job(bob.job_id).telemetry is not None, 30), controller.events(bob.job_id)
    placement = controller.job(bob.job_id).status.placement
    assert placement is not None and placement.opportunistic
    return bob.job_id


def submit_alice(controller: Controller, mem_mib: int) -> str:
    """A guaranteed job of alice's (quota 1) reserving ``mem_mib`` of the GPU for 4 s."""
    alice = controller.submit(
        JobRequest(
            command=(sys.executable, "-c", "import time; time.sleep(4)"),
            tenant="alice",
            cwd=str(EXAMPLE.parent),
            gpu_mem_mib=mem_mib,
        )
    )
    wait_phase(controller, alice.job_id, JobPhase.RUNNING)
    return alice.job_id


def test_a_guaranteed_job_shrinks_an_opportunistic_ones_memory_which_degrades_then_recovers(
    controller: Controller,
) -> None:
    bob = submit_bob(controller)
    log = controller.log_path(bob)
    alice = submit_alice(controller, GPU_MIB - 16)
    # Bob's job is told a cap of what alice's reservation leaves and degrades to fit it.
    shrunk = re.compile(r"memory cap (\d+) MiB, now (micro\S+)")
    assert wait_until(lambda: shrunk.search(log.read_text()) is not None, 30), (
        log.read_text(),
        controller.events(bob),
        controller.events(alice),
    )
    match = shrunk.search(log.read_text())
    assert match is not None and int(match.group(1)) <= 16
    assert controller.job(bob).phase is JobPhase.RUNNING  # slowed, not failed or suspended
    assert "resized" in [e.kind for e in controller.events(bob)]

    wait_phase(controller, alice, JobPhase.FINISHED)
    # With alice gone the cap grows back and the job climbs to the full batch again.
    assert wait_until(lambda: re.search(r"now full\b", log.read_text()) is not None, 40), log.read_text()
    assert controller.job(bob).phase is JobPhase.RUNNING


@pytest.mark.parametrize("controller", ["antman:reclaim=preempt"], indirect=True)
def test_a_suspended_opportunistic_job_gives_its_memory_back_and_resumes_in_place(controller: Controller) -> None:
    bob = submit_bob(controller)
    alice = submit_alice(controller, GPU_MIB - 8)

    def said(kind: str, words: str) -> bool:
        return any(e.kind == kind and words in e.detail for e in controller.events(bob))

    assert wait_until(lambda: said("paused", "state in host memory"), 30), controller.events(bob)
    assert said("suspended", "state to host memory")
    wait_phase(controller, alice, JobPhase.FINISHED)
    assert wait_until(lambda: said("resumed", "state restored in"), 30), controller.events(bob)
    record = wait_phase(controller, bob, JobPhase.RUNNING)
    assert record.process.run == 1  # the same process: resumed in place, not restarted from a checkpoint
    log = controller.log_path(bob).read_text()
    assert re.search(r"=== corral: run 1 paused at step \d+ .*: its state moved to host memory ===", log), log[-2000:]
    assert re.search(r"=== corral: run 1 resumed at step \d+ ", log), log[-2000:]
