"""Checkpoints: the atomic store, the random generators' states, and resuming a data loader mid-epoch in the same
order (in-process, with real PyTorch on the CPU)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from corral.core import contract
from corral.job import CheckpointError, CheckpointStore, Job
from corral.job.checkpoint import RngState, fast_forward, loader_generators

# -- the store --------------------------------------------------------------------------------------------------


def write_file(name: str, text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        (path / name).write_text(text)

    return write


def test_store_keeps_the_latest_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    assert store.latest() is None
    first = store.save(write_file("a", "1"), step=10)
    assert store.latest() == first and first.name.startswith("ckpt-000000010-")
    second = store.save(write_file("a", "2"), step=20)
    assert store.latest() == second and not first.exists()
    assert (second / "a").read_text() == "2"
    assert sorted(p.name for p in store.root.iterdir()) == sorted(["latest", second.name])


def test_a_failed_save_changes_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    good = store.save(write_file("a", "1"), step=1)

    def crash(path: Path) -> None:
        (path / "half").write_text("partial")
        raise KeyboardInterrupt  # a kill in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        store.save(crash, step=2)
    assert store.latest() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest", good.name])


def test_leftovers_of_a_killed_save_are_removed_by_the_next(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    (tmp_path / ".tmp-ckpt-deadbeef-1").mkdir()  # as a SIGKILL during a save leaves it
    (tmp_path / "ckpt-000000005-deadbeef-1").mkdir()  # renamed, but the pointer never updated
    (tmp_path / "mine").mkdir()  # not the store's: kept
    latest = store.save(write_file("a", "1"), step=7)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest", latest.name, "mine"])


def test_a_bad_pointer_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "latest").write_text("../../etc\n")
    with pytest.raises(CheckpointError, match="latest"):
        CheckpointStore(tmp_path).latest()


# -- random generators ------------------------------------------------------------------------------------------


def draws(gen: torch.Generator) -> tuple[float, float, float, float]:
    return (random.random(), float(np.random.rand()), torch.rand(1).item(), torch.rand(1, generator=gen).item())


def test_rng_state_round_trips_through_json() -> None:
    gen = torch.Generator().manual_seed(3)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draws(gen)
    saved = RngState.capture([gen]).to_json()
    expected = draws(gen)
    draws(gen)
    RngState.from_json(saved).restore([gen])
    assert draws(gen) == expected


# -- resuming a loader mid-epoch --------------------------------------------------------------------------------

DATA = TensorDataset(torch.arange(40).reshape(20, 2))

LOADERS: dict[str, Callable[[], Iterable[Any]]] = {
    "shuffled": lambda: DataLoader(DATA, batch_size=2, shuffle=True),
    "own generator": lambda: DataLoader(DATA, batch_size=2, shuffle=True, generator=torch.Generator()),
    "plain list": lambda: [t for t in torch.randperm(20).reshape(10, 2)],
    "workers": lambda: DataLoader(DATA, batch_size=2, shuffle=True, num_workers=2),
}


def train(ckpt: Path, make_loader: Callable[[], Iterable[Any]], stop_at: int | None = None) -> list[Any]:
    """Three epochs of a loop that records each batch and a draw from each generator; a checkpoint is requested
    during global step ``stop_at``."""
    seen: list[Any] = []
    job = Job(env={}, checkpoint_dir=ckpt, handle_sigterm=False)
    try:
        for epoch in job.epochs(3):
            for batch in job.loop(make_loader()):
                seen.append((epoch, job.step_in_epoch, str(batch), random.random(), torch.rand(1).item()))
                if job.global_step == stop_at:
                    job.request_checkpoint()
    except SystemExit as e:
        assert e.code == contract.EXIT_PREEMPTED
    job.close()
    return seen


CASES = [(loader, stop_at) for loader in LOADERS if loader != "workers" for stop_at in (3, 9, 14)]
CASES.append(("workers", 14))  # worker processes are slow to start: one case


@pytest.mark.parametrize(("loader", "stop_at"), CASES)  # stop mid-epoch, at the last step of an epoch, mid-epoch after
def test_a_resumed_loop_sees_what_an_uninterrupted_one_sees(tmp_path: Path, loader: str, stop_at: int) -> None:
    make = LOADERS[loader]
    random.seed(0)
    torch.manual_seed(0)
    whole = train(tmp_path / "none", make)
    assert len(whole) == 30

    random.seed(0)
    torch.manual_seed(0)
    first = train(tmp_path / "ck", make, stop_at=stop_at)
    assert len(first) == stop_at + 1
    random.seed(123)  # the resumed run starts from other generator states: the checkpoint must restore them
    torch.manual_seed(123)
    second = train(tmp_path / "ck", make)
    assert first + second == whole


def test_fast_forward_skips_indices_without_loading() -> None:
    loaded: list[int] = []

    class Recording(torch.utils.data.Dataset[int]):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> int:
            loaded.append(i)
            return i

    it = iter(DataLoader(Recording(), batch_size=2))
    assert fast_forward(it, 3) == 3 and loaded == []
    assert next(it).tolist() == [6, 7]
    assert fast_forward(it, 5) == 1  # ran out


def test_loader_generators_found_once() -> None:
    gen = torch.Generator()
    assert loader_generators(DataLoader(DATA, shuffle=True, generator=gen)) == [gen]
    assert loader_generators(DataLoader(DATA)) == []
    assert loader_generators(range(3)) == []
