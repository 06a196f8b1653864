"""Pipelined restore (corral.job.pipeline, PipeSwitch §4.2) on the CPU with the simulated device: the groups'
rule, the order of copies, events and forward passes, and a result bit-identical to a plain restore."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="corral.job's memory tests need torch (pip install corral[torch])")

from corral.job.device import SimulatedDevice  # noqa: E402
from corral.job.memory import Residency  # noqa: E402
from corral.job.pipeline import Destinations, first_group_bytes, leaf_modules, plan_groups  # noqa: E402


# -- the groups ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sizes, first",
    [([10] * 40, 10), ([1, 1, 1, 100, 5, 0, 300, 2], 2), ([1000], 10), ([0, 0, 5], 1), ([3] * 7, 100), ([], 4)],
)
def test_groups_cover_every_module_once_in_order_and_grow(sizes: list[int], first: int) -> None:
    groups = plan_groups(sizes, first)
    assert [i for g in groups for i in g] == list(range(len(sizes)))  # consecutive, each module once
    held = [sum(sizes[i] for i in g) for g in groups]
    if len(groups) > 1:
        assert held[0] >= first
        # each group closed once it held twice its predecessor; the last may be short, but never a small tail
        assert all(later >= 2 * earlier for earlier, later in itertools.pairwise(held[:-1]))
        assert held[-1] >= 2 * held[-2] // 4


def test_forty_equal_layers_make_a_logarithmic_number_of_groups() -> None:
    groups = plan_groups([10] * 40, 10)
    assert [len(g) for g in groups] == [1, 2, 4, 8, 16, 9]  # 10, 20, 40, 80, 160 bytes, then the rest (90)


def test_the_first_group_copies_twenty_times_a_groups_cost() -> None:
    assert first_group_bytes(20.0) == 12_000_000  # 20 x 30 us at 20 GB/s
    assert first_group_bytes(1e-12) == 1


# -- the order and the result --------------------------------------------------------------------------------
def make_model() -> Any:
    """Layers in a container, and a block whose forward reads a child's weight without calling it
    (nn.MultiheadAttention and its out_proj)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
        torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
        torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4),
    )  # fmt: skip


def train(model: Any, opt: Any, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 5, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad(set_to_none=False)  # in place: the gradients must be back before this
        torch.nn.functional.cross_entropy(model(x).mean(dim=1), y).backward()
        opt.step()


def evicted_job(gbps: float) -> tuple[Any, Any, SimulatedDevice, Residency]:
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    device = SimulatedDevice(capacity_mib=1024)
    residency = Residency(model, opt, device)
    device.attach(residency)
    train(model, opt, 3, seed=1)  # gradients and Adam's state exist: all three kinds of slot are moved
    residency.evict()
    residency.copy_gbps = gbps  # tiny: many groups on a tiny model
    return model, opt, device, residency


def test_each_layer_waits_for_its_own_group_and_the_optimizer_for_its_state() -> None:
    model, opt, device, residency = evicted_job(gbps=2e-5)  # a first group of 12 bytes: one layer each, then more
    residency.restore(pipelined=True)
    assert residency.pending and not residency.evicted
    log = device.pipeline_log
    names = {id(m): name for name, m in model.named_modules()}
    for m in model.modules():
        m.register_forward_pre_hook(lambda mod, _args: log.append(("forward", names[id(mod)])))
    opt.register_step_pre_hook(lambda *_: log.append(("step", None)))
    train(model, opt, 1, seed=2)
    residency.settle()
    assert not residency.pending and log[-1] == ("finish", None)

    marks = [v for k, v in log if k == "mark"]
    assert len(marks) >= 5  # the gradients, several groups of layers, the optimizer's state
    at = {entry: i for i, entry in enumerate(log) if entry[0] != "copy"}
    copied_before: dict[object, set[int]] = {}  # mark -> the tensors (storages) copied before it
    seen: set[int] = set()
    for kind, value in log:
        if kind == "copy":
            seen.add(value.data_ptr())
        elif kind == "mark":
            copied_before[value] = set(seen)

    def last_wait_before(entry: tuple[str, object]) -> object:
        waits = [i for i in range(at[entry]) if log[i][0] == "wait"]
        assert waits, f"{entry} ran before waiting for any copy"
        return log[waits[-1]][1]

    parent = {id(c): name for name, m in model.named_modules() for c in m.children() if m is not model}
    assert last_wait_before(("forward", "")) == marks[0]  # the model starts once the gradients are back
    for m in leaf_modules(model):
        # the layer (or the block that reads its weights, when it has one) waited for an event recorded after
        # its own tensors were copied
        runs = parent.get(id(m), names[id(m)])
        mine = {t.data_ptr() for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))}
        assert mine <= copied_before[last_wait_before(("forward", runs))], names[id(m)]
    first_layer = names[id(leaf_modules(model)[0])]
    assert last_wait_before(("forward", first_layer)) == marks[1]  # after the first group, not the whole model
    assert last_wait_before(("step", None)) == marks[-1]  # the optimizer's state is the last group
    grads = {p.grad.data_ptr() for p in model.parameters()}
    assert grads <= copied_before[marks[0]]
    # every hook fired once and removed itself: a second step adds no waits
    before = len(log)
    train(model, opt, 1, seed=3)
    assert all(kind != "wait" for kind, _ in log[before:])


@pytest.mark.parametrize("gbps", [2e-5, 20.0])
def test_a_pipelined_restore_is_bit_identical_to_a_plain_one(gbps: float) -> None:
    plain_model, plain_opt, _, plain = evicted_job(gbps)
    model, opt, _, pipelined = evicted_job(gbps)
    plain.restore()
    pipelined.restore(pipelined=True)
    train(plain_model, plain_opt, 4, seed=5)
    train(model, opt, 4, seed=5)
    pipelined.settle()
    for a, b in zip(plain_model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    reference = copy.deepcopy(plain_opt.state_dict())
    for a, b in zip(reference["state"].values(), opt.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_evicting_again_before_the_next_boundary_settles_first() -> None:
    _model, _opt, device, residency = evicted_job(gbps=2e-5)
    residency.restore(pipelined=True)
    residency.evict()  # no step ran: the hooks never fired
    assert not residency.pending and residency.evicted
    assert ("finish", None) in device.pipeline_log


def test_without_pipelining_nothing_is_pending() -> None:
    _model, _opt, device, residency = evicted_job(gbps=2e-5)
    residency.restore()
    assert not residency.pending and device.pipeline_log == []


def test_every_copy_lands_in_the_destination_prepared_for_it() -> None:
    # The destinations are allocated before any copy (CopyPipeline.prepare) and found again by their source.
    # A parameter's host tensor is reached through `param.data`, a new Python object at each access: keyed by
    # object identity, a copy found another tensor's destination (a size mismatch on an H100, 2026-11-28).
    _model, _opt, device, residency = evicted_job(gbps=2e-5)
    pipes = []
    make = device.pipeline

    def spy() -> object:
        pipes.append(make())
        return pipes[-1]

    device.pipeline = spy  # type: ignore[method-assign]
    residency.restore(pipelined=True)
    residency.settle()
    prepared = [n for kind, n in device.pipeline_log if kind == "prepare"]
    copies = [t for kind, t in device.pipeline_log if kind == "copy"]
    assert prepared == [len(copies)] and len(copies) > 10
    assert len(pipes) == 1 and len(pipes[0].ready) == 0  # each destination taken by its own copy


def test_destinations_are_found_by_the_source_memory_not_the_python_object() -> None:
    weights = [torch.nn.Parameter(torch.randn(n, 3)) for n in (2, 5, 7)]
    ready = Destinations()
    ready.fill([(w.data, torch.device("cpu")) for w in weights])
    for w in reversed(weights):  # other `.data` objects than those prepared, in another order
        dest = ready.take(w.data)
        assert dest is not None and dest.shape == w.shape and dest.data_ptr() != w.data_ptr()
    assert ready.take(weights[0].data) is None and len(ready) == 0
