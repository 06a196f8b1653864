"""The guide to ``corral.job`` (``docs/job-library.md``) cannot rot: its complete example (the first ``python``
block under the heading "A complete example") runs standalone on the CPU, is preempted by ``SIGTERM`` with a
checkpoint directory (exit 75), resumes, and ends with the weights of an uninterrupted run; and every
``job.NAME`` the guide mentions is an attribute of a :class:`~corral.job.Job`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral.core import contract
from corral.job import CheckpointStore, Job

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "job-library.md"
HEADING = "## A complete example"
ARGS = ["--epochs", "3", "--steps-per-epoch", "10", "--batch-size", "16"]  # 30 steps


def example_source() -> str:
    """The first fenced ``python`` block after the guide's "A complete example" heading."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.find(f"\n{HEADING}\n")
    assert start >= 0, f"{GUIDE}: no heading {HEADING!r}"
    block = re.search(r"^```python\n(.*?)^```$", text[start:], re.DOTALL | re.MULTILINE)
    assert block is not None, f"{GUIDE}: no ```python block after {HEADING!r}"
    return block.group(1)


def start(script: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}  # standalone: no agent
    base["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, so that runs are comparable bit for bit
    base["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [sys.executable, str(script), *ARGS, *extra],
        cwd=script.parent,
        env=base | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_the_guide_names_only_attributes_a_job_has() -> None:
    names = set(re.findall(r"`job\.([a-z_]+)", GUIDE.read_text(encoding="utf-8")))
    assert {"loop", "train_step", "request_checkpoint", "step"} <= names
    with Job(env={}) as job:
        missing = sorted(n for n in names if not hasattr(job, n))
    assert not missing, f"{GUIDE} names job attributes that do not exist: {missing}"


def test_complete_example_runs_standalone_and_resumes_bit_exactly(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(example_source(), encoding="utf-8")
    ckpt = tmp_path / "ckpt"

    # An uninterrupted run, and (at the same time, to keep the test short) one preempted after its first epoch.
    whole = start(script, "--save-weights", "a.pt")
    cut = start(script, "--step-sleep", "0.1", "--save-weights", "b.pt", env={contract.ENV_CHECKPOINT_DIR: str(ckpt)})
    assert cut.stdout is not None
    seen = []
    for line in cut.stdout:
        seen.append(line)
        if line.startswith("epoch 0:"):
            cut.send_signal(signal.SIGTERM)  # two seconds of steps are left: it is still training
            break
    code, rest = finish(cut)
    out = "".join(seen) + rest
    assert code == contract.EXIT_PREEMPTED, out
    assert "training on cpu (standalone) from step 0" in out
    assert "(SIGTERM); exiting with 75" in out
    assert CheckpointStore(ckpt).latest() is not None

    code, out = finish(whole)
    assert code == 0, out
    assert "training on cpu (standalone) from step 0" in out
    assert "done: 30 steps" in out

    code, out = finish(start(script, "--save-weights", "b.pt", env={contract.ENV_CHECKPOINT_DIR: str(ckpt)}))
    assert code == 0, out
    assert "corral.job: resumed from" in out
    assert "done: 30 steps" in out

    a = torch.load(tmp_path / "a.pt", weights_only=True)
    b = torch.load(tmp_path / "b.pt", weights_only=True)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a resume"
