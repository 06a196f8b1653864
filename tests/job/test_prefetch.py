"""Checkpoint prefetch (issue 19): the state of the checkpoint a run resumes from is read on a background thread
while the script starts, and the restore uses it only when the file is still the one read; a failing or stale
prefetch falls back to a normal read and says why. In-process, real PyTorch on the CPU (the pinned-memory path
with ordinary memory standing in for pinned memory); the warm worker's side is in ``tests/live/test_warm_start.py``."""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="checkpoints of model state need torch (pip install corral[torch])")

from corral.core import contract  # noqa: E402
from corral.core.errors import ConfigError  # noqa: E402
from corral.job import Job, checkpoint, prefetch_checkpoint  # noqa: E402
from corral.job import prefetch as prefetching  # noqa: E402
from corral.job.checkpoint import STATE_NAME, CheckpointStore  # noqa: E402
from corral.job.env import ENV_CHECKPOINT_PREFETCH, ENV_CHECKPOINT_PREFETCH_MIN_MIB, JobEnvironment  # noqa: E402
from corral.job.prefetch import PREFETCH_MIN_BYTES, Prefetch, claim_prefetch, pending_prefetch  # noqa: E402
from corral.job.prefetch import prefetch_from_env as start_from_env  # noqa: E402

STEPS, STOP_AT = 12, 5
HIDDEN = 1024  # the first layer's weight and its Adam moments, 64 KiB each, are large enough to be pinned
RESUMED_AT = STOP_AT + 1  # the checkpoint asked for during step 5 is taken at the next boundary


@pytest.fixture(autouse=True)
def no_leftover_prefetch() -> Iterator[None]:
    claim_prefetch()
    yield
    leftover = claim_prefetch()
    if leftover is not None:
        leftover.take(leftover.path)  # let its thread end before the next test


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(
        torch.nn.Linear(16, HIDDEN), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(HIDDEN, 4)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(ckpt: Path | None, stop_at: int | None = None, **job_kwargs: Any) -> tuple[dict[str, Any], Job]:
    """Steps of a small model with dropout and Adam on data drawn from the global generator; a checkpoint and exit
    is requested during step ``stop_at``. Returns the final weights and the job."""
    model, opt = make()
    job = Job(
        model=model, optimizer=opt, env={}, checkpoint_dir=ckpt, handle_sigterm=False, verbose=False, **job_kwargs
    )
    try:
        for _ in job.loop(range(STEPS)):
            x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if job.global_step == stop_at:
                job.request_checkpoint()
    except SystemExit as e:
        assert e.code == contract.EXIT_PREEMPTED
    job.close()
    return {k: v.clone() for k, v in model.state_dict().items()}, job


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def checkpointed(tmp_path: Path) -> Path:
    """A checkpoint directory whose latest checkpoint is train()'s at RESUMED_AT."""
    torch.manual_seed(0)
    train(tmp_path, stop_at=STOP_AT)
    return tmp_path


def state_file(ckpt: Path) -> Path:
    latest = CheckpointStore(ckpt).latest()
    assert latest is not None
    return latest / STATE_NAME


def wait_done(p: Prefetch) -> None:
    deadline = time.monotonic() + 30
    while not p.done():
        assert time.monotonic() < deadline, "the prefetch thread did not finish"
        time.sleep(0.005)


def fake_pinned(nbytes: int) -> Any:
    """Stands in for a pinned allocation on a machine without CUDA: ordinary memory."""
    return torch.empty(nbytes, dtype=torch.uint8).untyped_storage()


# -- bit-exact resume -----------------------------------------------------------------------------------------
def test_a_resume_is_bit_exact_with_and_without_prefetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    whole, _ = train(None)
    ckpt = checkpointed(tmp_path / "ck")

    results = {}
    for mode in ("plain", "prefetch", "pinned"):
        torch.manual_seed(123)  # other generator states: the checkpoint must restore them
        if mode == "prefetch":
            assert prefetch_checkpoint(ckpt, min_bytes=0) is not None
        elif mode == "pinned":  # the CUDA path: ordinary memory stands in for pinned memory
            pinning = Prefetch(state_file(ckpt), pin=True, pinned_alloc=fake_pinned)
            monkeypatch.setattr(prefetching, "_prefetch", pinning)
            wait_done(pinning)
            assert pinning.pinned == 3  # the first layer's weight and its two Adam moments
        weights, job = train(ckpt)
        assert job.start_step == RESUMED_AT and job.global_step == STEPS
        assert job.prefetched == (mode != "plain"), mode
        results[mode] = weights
    for mode, weights in results.items():
        assert same(weights, whole), mode


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_the_environment_starts_it_for_a_large_enough_file_and_can_turn_it_off(tmp_path: Path) -> None:
    ckpt = checkpointed(tmp_path)
    path = state_file(ckpt)
    env = {contract.ENV_CHECKPOINT_DIR: str(ckpt), ENV_CHECKPOINT_PREFETCH: "1"}
    assert path.stat().st_size < PREFETCH_MIN_BYTES
    assert start_from_env(env) is None  # a small file: read in milliseconds, not worth a thread
    env[ENV_CHECKPOINT_PREFETCH_MIN_MIB] = "0"
    assert start_from_env({}) is None  # no checkpoint directory
    assert start_from_env({**env, ENV_CHECKPOINT_PREFETCH: "0"}) is None
    assert start_from_env({**env, contract.ENV_CHECKPOINT_DIR: str(tmp_path / "empty")}) is None  # no checkpoint
    for name, bad in ((ENV_CHECKPOINT_PREFETCH, "maybe"), (ENV_CHECKPOINT_PREFETCH_MIN_MIB, "-1")):
        assert start_from_env({**env, name: bad}) is None  # Job() says what is wrong:
        with pytest.raises(ConfigError, match=name):
            JobEnvironment.from_env({name: bad})
    parsed = JobEnvironment.from_env({ENV_CHECKPOINT_PREFETCH: "0", ENV_CHECKPOINT_PREFETCH_MIN_MIB: "8"})
    assert (parsed.checkpoint_prefetch, parsed.checkpoint_prefetch_min_mib) == ("0", 8)
    assert JobEnvironment.from_env({}).checkpoint_prefetch == "auto"
    first = start_from_env(env)
    assert first is not None and first.path == path
    assert start_from_env(env) is first and pending_prefetch() is first  # one prefetch, however often asked
    assert claim_prefetch() is first and pending_prefetch() is None
    assert first.take(first.path) is not None


def test_auto_prefetches_a_checkpoint_the_page_cache_does_not_hold(tmp_path: Path) -> None:
    ckpt = checkpointed(tmp_path)
    path = state_file(ckpt)
    env = {contract.ENV_CHECKPOINT_DIR: str(ckpt), ENV_CHECKPOINT_PREFETCH_MIN_MIB: "0"}  # "auto": the default
    _ = path.read_bytes()
    assert prefetching.in_page_cache(path)  # just written and read: this node has it
    assert start_from_env(env) is None
    evict(path)
    if prefetching.in_page_cache(path):
        pytest.skip("this filesystem keeps the file in memory (tmpfs) or cannot say what is cached")
    p = start_from_env(env)  # as on a node the job migrated to
    assert p is not None and p.take(path) is not None


# -- used when unchanged, not when changed ---------------------------------------------------------------------
def test_the_prefetched_state_is_used_when_the_file_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = checkpointed(tmp_path)
    reads: list[str] = []
    real = checkpoint.read_state

    def counted(path: Path, **kwargs: Any) -> dict[str, Any]:
        reads.append(threading.current_thread().name)
        return real(path, **kwargs)

    monkeypatch.setattr(checkpoint, "read_state", counted)
    p = prefetch_checkpoint(ckpt, min_bytes=0)
    assert p is not None
    wait_done(p)
    assert p.read_s is not None and p.pinned == 0  # no CUDA here: nothing pinned
    _, job = train(ckpt)
    assert job.prefetched and reads == ["corral-checkpoint-prefetch"]  # the restore did not read the file again


def test_a_file_changed_after_the_prefetch_began_is_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = checkpointed(tmp_path)
    path = state_file(ckpt)
    p = prefetch_checkpoint(ckpt, min_bytes=0)
    assert p is not None
    wait_done(p)
    saved = torch.load(path, weights_only=True)
    for tensor in saved["model"].values():
        tensor.add_(1.0)  # other weights, same shapes and size
    torch.save(saved, path)
    with caplog.at_level(logging.WARNING, logger="corral.job"):
        model, opt = make()
        job = Job(model=model, optimizer=opt, env={}, checkpoint_dir=ckpt, handle_sigterm=False, verbose=False)
        job.close()
    assert not job.prefetched
    assert same(model.state_dict(), saved["model"])  # the file as it is now
    assert "checkpoint prefetch not used" in caplog.text and "changed after the prefetch began" in caplog.text


def test_a_file_changed_while_it_was_read_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = checkpointed(tmp_path)
    real = checkpoint.read_state

    def read_then_touch(path: Path, **kwargs: Any) -> dict[str, Any]:
        state = real(path, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            os.utime(path, ns=(1, 1))  # the file changes during the read
        return state

    monkeypatch.setattr(checkpoint, "read_state", read_then_touch)
    assert prefetch_checkpoint(ckpt, min_bytes=0) is not None
    with caplog.at_level(logging.WARNING, logger="corral.job"):
        _, job = train(ckpt)
    assert not job.prefetched and job.start_step == RESUMED_AT
    assert "changed after the prefetch began" in caplog.text


def test_a_job_restoring_another_directory_does_not_use_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    one, two = checkpointed(tmp_path / "one"), checkpointed(tmp_path / "two")
    assert prefetch_checkpoint(one, min_bytes=0) is not None
    with caplog.at_level(logging.WARNING, logger="corral.job"):
        _, job = train(two)
    assert not job.prefetched and job.start_step == RESUMED_AT
    assert f"it read {state_file(one)}, and the job restores {state_file(two)}" in caplog.text
    assert pending_prefetch() is None  # taken by the restore, used or not: its memory is gone with it


# -- failures fall back, and say why ---------------------------------------------------------------------------
def test_a_failing_prefetch_falls_back_to_a_normal_read_and_logs_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    whole, _ = train(None)
    ckpt = checkpointed(tmp_path)
    real = checkpoint.read_state

    def fails_in_the_thread(path: Path, **kwargs: Any) -> dict[str, Any]:
        if threading.current_thread() is not threading.main_thread():
            raise OSError("the disk is on fire")
        return real(path, **kwargs)

    monkeypatch.setattr(checkpoint, "read_state", fails_in_the_thread)
    assert prefetch_checkpoint(ckpt, min_bytes=0) is not None
    with caplog.at_level(logging.WARNING, logger="corral.job"):
        torch.manual_seed(123)
        weights, job = train(ckpt)
    assert not job.prefetched and same(weights, whole)
    assert "checkpoint prefetch not used (reading it failed: OSError: the disk is on fire)" in caplog.text


def test_a_failure_to_pin_keeps_the_state_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    whole, _ = train(None)
    ckpt = checkpointed(tmp_path)
    calls = []

    def pins_once(nbytes: int) -> Any:
        calls.append(nbytes)
        if len(calls) > 1:
            raise RuntimeError("out of pinned memory")
        return fake_pinned(nbytes)

    p = prefetching._prefetch = Prefetch(state_file(ckpt), pin=True, pinned_alloc=pins_once)
    wait_done(p)
    with caplog.at_level(logging.WARNING, logger="corral.job"):
        torch.manual_seed(123)
        weights, job = train(ckpt)
    assert job.prefetched and same(weights, whole)
    assert "pinning the state in host memory failed after 1 storages (RuntimeError: out of pinned memory)" in (
        caplog.text
    )


def test_the_state_it_gives_holds_nothing_of_the_files_mapping(tmp_path: Path) -> None:
    ckpt = checkpointed(tmp_path)
    path = state_file(ckpt)
    p = prefetch_checkpoint(ckpt, min_bytes=0)
    assert p is not None
    state = p.take(path)
    assert state is not None
    assert str(path) not in Path("/proc/self/maps").read_text()  # every storage was read out of it
    plain = checkpoint.read_state(path)
    assert same(state["model"], plain["model"])
    assert state["optimizer"]["param_groups"] == plain["optimizer"]["param_groups"]
    for index, moments in plain["optimizer"]["state"].items():
        assert same(state["optimizer"]["state"][index], moments)


def test_a_state_it_cannot_copy_is_read_normally(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.pt"
    torch.save({"x": torch.nn.Parameter(torch.ones(3))}, path)  # a Parameter: not a plain tensor
    p = Prefetch(path)
    with caplog.at_level(logging.WARNING, logger="corral.job"):
        assert p.take(path) is None
    assert "it holds a tensor the prefetch does not copy (Parameter" in caplog.text


# -- pinning ---------------------------------------------------------------------------------------------------
def test_pinning_keeps_shared_storages_and_metadata_and_skips_small_tensors(tmp_path: Path) -> None:
    big = torch.arange(64 * 1024, dtype=torch.float32)  # 256 KiB
    model = torch.nn.Linear(256, 256)
    state = {"m": model.state_dict(), "views": [big, big[10:20], big.view(256, 256)], "small": torch.ones(3)}
    torch.save(state, tmp_path / "s.pt")
    p = Prefetch(tmp_path / "s.pt", pin=True, pinned_alloc=fake_pinned)
    wait_done(p)
    got = p.take(tmp_path / "s.pt")
    assert got is not None
    a, b, c = got["views"]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
    assert torch.equal(a, big) and torch.equal(b, big[10:20]) and torch.equal(c, big.view(256, 256))
    assert b.storage_offset() == 10 and c.shape == (256, 256)
    assert isinstance(got["m"], collections.OrderedDict) and hasattr(got["m"], "_metadata")
    assert torch.equal(got["m"]["weight"], model.weight) and torch.equal(got["small"], torch.ones(3))
    assert p.pinned == 2  # the views' storage and the weight; the bias and the small tensor are too small


def test_the_restore_does_not_wait_for_the_pinning(tmp_path: Path) -> None:
    state = {f"t{i}": torch.full((64 * 1024,), float(i)) for i in range(4)}
    torch.save(state, tmp_path / "s.pt")
    started, made = threading.Event(), threading.Event()
    holder: dict[str, Prefetch] = {}

    def slow_pin(nbytes: int) -> Any:
        started.set()
        assert made.wait(10)  # (the thread may get here before the constructor has returned)
        assert holder["p"]._stop.wait(10)  # pinning until the restore comes
        return fake_pinned(nbytes)

    holder["p"] = p = Prefetch(tmp_path / "s.pt", pin=True, pinned_alloc=slow_pin)
    made.set()
    assert started.wait(10)
    got = p.take(tmp_path / "s.pt")
    assert got is not None and p.pinned == 1  # stopped after the storage under way: the rest stays pageable
    assert all(torch.equal(got[k], v) for k, v in state.items())


# -- a cold run: started by `import corral.job` ------------------------------------------------------------------
COLD = """
import sys, json
import torch
import corral.job
from corral.job.prefetch import pending_prefetch
started = pending_prefetch() is not None  # right after the import, before the model exists
model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(1024, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
job = corral.job.Job(model=model, optimizer=opt)
print(json.dumps({"started": started, "prefetched": job.prefetched, "step": job.start_step}))
job.close()
"""


def test_importing_corral_job_starts_the_prefetch_of_a_cold_run(tmp_path: Path) -> None:
    ckpt = checkpointed(tmp_path / "ck")
    script = tmp_path / "cold.py"
    script.write_text(COLD)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    base[contract.ENV_CHECKPOINT_DIR] = str(ckpt)
    base[ENV_CHECKPOINT_PREFETCH_MIN_MIB] = "0"  # a small checkpoint
    for setting, expected in (("1", True), ("0", False)):
        env = {**base, ENV_CHECKPOINT_PREFETCH: setting}
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen == {"started": expected, "prefetched": expected, "step": RESUMED_AT}
        assert ("state prefetched" in proc.stderr) is expected, proc.stderr


def test_the_benchmark_runs_its_four_modes(tmp_path: Path) -> None:
    """``benchmarks/bench_prefetch.py --smoke``: a tiny model, one resumed run of each mode through an agent."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_prefetch.py"
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    for mode in ("cold, prefetch off", "cold, prefetch on", "warm, prefetch off", "warm, prefetch on"):
        assert figures[mode]["start_to_first_step_ms"] > 0, mode
    assert "prefetch saves" in proc.stdout
