"""Bit-exact resume of a real training script (``examples/train_mlp.py``) in real processes: preempted mid-epoch,
by SIGTERM and then by a ``Checkpoint`` directive from an agent, it exits with 75 each time, and run again it ends
with the very weights of an uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from job_agent_peer import AgentPeer, agent_env

from corral.core import contract
from corral.job import CheckpointStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_mlp.py"
ARGS = ["--epochs", "3", "--steps-per-epoch", "40", "--batch-size", "16"]  # 120 steps


def start(*extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    base["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, so that runs are comparable bit for bit
    base["OMP_NUM_THREADS"] = "1"  # small tensors: threads would only contend
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *ARGS, *extra],
        env=base | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"{name} differs"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("whole") / "weights.pt"
    code, out = finish(start("--save-weights", str(path)))
    assert code == 0, out
    assert "done: 120 steps" in out
    yield path


def test_preempted_by_sigterm_then_by_a_directive_then_resumed_is_bit_exact(
    uninterrupted: Path, peer: AgentPeer, tmp_path: Path
) -> None:
    ckpt = str(tmp_path / "ckpt")
    out_path = tmp_path / "weights.pt"

    # Run 1, standalone with a checkpoint directory: SIGTERM during step 30 (of 40 in epoch 0).
    code, out = finish(
        start("--sigterm-at-step", "30", "--save-weights", str(out_path), env={"CORRAL_CHECKPOINT_DIR": ckpt})
    )
    assert code == contract.EXIT_PREEMPTED, out
    assert not out_path.exists()
    latest = CheckpointStore(ckpt).latest()
    assert latest is not None and latest.name.startswith("ckpt-000000031-")

    # Run 2, under an agent: resumes at step 31, then is paused and told to checkpoint.
    env = agent_env(peer, job_id="mlp", run=2, **{contract.ENV_CHECKPOINT_DIR: ckpt})
    proc = start("--step-sleep", "0.01", "--save-weights", str(out_path), env=env)
    try:
        hello = peer.expect(contract.Hello, timeout=60)
        assert (hello.job_id, hello.run, hello.pid) == ("mlp", 2, proc.pid)
        # Pausing first makes the job stand still at a boundary, whatever the timing, until told what next.
        peer.expect(contract.StepReport, lambda r: r.step >= 10, timeout=60)
        peer.send(contract.Pause(reason="preempting"))
        paused = peer.expect(contract.Paused)
        peer.send(contract.Checkpoint(reason="preempted by a guaranteed job"))
        done = peer.expect(contract.Checkpointed)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == contract.EXIT_PREEMPTED, out
    assert "resumed at step 31 (epoch 0)" in out
    assert done.step == 31 + paused.step < 120  # Checkpointed counts all runs' steps, Paused this run's
    assert Path(done.path) == CheckpointStore(ckpt).latest()

    # Run 3: resumes where run 2 stopped and finishes.
    env[contract.ENV_RUN] = "3"
    code, out = finish(start("--save-weights", str(out_path), env=env))
    assert code == 0, out
    assert peer.expect(contract.Hello).run == 3
    assert f"resumed at step {done.step}" in out
    assert_same_weights(uninterrupted, out_path)
