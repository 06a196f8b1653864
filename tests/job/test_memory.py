"""The memory side of AntMan inside the job (:mod:`corral.job.memory`), with real PyTorch on the CPU.

GPU memory is modelled by :class:`~corral.job.device.SimulatedDevice`, which raises PyTorch's own
``torch.OutOfMemoryError`` where a GPU would: the ladder reacts to the real exception type, as it does on CUDA.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections import namedtuple
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from corral.job import Job  # noqa: E402
from corral.job.device import SimulatedDevice, TorchDevice  # noqa: E402
from corral.job.memory import (  # noqa: E402
    ElasticStep,
    Ladder,
    LadderExhausted,
    Residency,
    Rung,
    batch_len,
    build_rungs,
    split_batch,
)

BATCH = 1024


def make_model(seed: int = 0) -> Any:
    """Activation-heavy: wide layers, small inputs, so the batch's activations dominate the memory."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def make_batch(seed: int = 1, n: int = BATCH) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def loss_of(model: Any) -> Any:
    return lambda b: F.cross_entropy(model(b[0]), b[1])


def grads(model: Any) -> list[Any]:
    return [p.grad.detach().clone() for p in model.parameters()]


def state_tensors(model: Any, opt: Any) -> list[Any]:
    out = [t.detach().clone() for t in model.state_dict().values()]
    for st in opt.state_dict()["state"].values():
        out += [v.detach().clone() for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def elastic(model: Any, opt: Any, device: Any, max_micro: int = 16) -> ElasticStep:
    residency = Residency(model, opt, device)
    device.attach(residency)
    return ElasticStep(residency, device, max_micro_batches=max_micro)


# -- micro-batching gives the full batch's gradients ---------------------------------------------------------------
@pytest.mark.parametrize("rung", [Rung(2), Rung(4), Rung(16), Rung(7), Rung(16, True), Rung(16, True, True)])
def test_a_rung_gives_the_full_batch_gradients_and_update(rung: Rung) -> None:
    batch = make_batch(n=1000)  # 1000 does not divide by 7 or 16: uneven micro-batches are weighted right
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_opt.zero_grad()
    loss_of(ref)(batch).backward()
    expected_grads = grads(ref)
    ref_opt.step()

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[Any]] = []
    step = elastic(model, opt, SimulatedDevice(capacity_mib=4096))
    step.ladder = Ladder([rung])
    step.run(batch, loss_of(model), before_step=lambda: seen.append(grads(model)))
    for got, want in zip(seen[0], expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_returned_loss_is_the_batch_mean() -> None:
    batch = make_batch(n=999)
    model = make_model()
    want = float(loss_of(copy.deepcopy(model))(batch).detach())
    step = elastic(model, torch.optim.SGD(model.parameters(), lr=0.0), TorchDevice())
    step.ladder = Ladder([Rung(8)])
    assert float(step.run(batch, loss_of(model))) == pytest.approx(want, rel=1e-5)


def test_split_batch_walks_containers() -> None:
    Pair = namedtuple("Pair", "x y")
    x = torch.arange(10).reshape(5, 2)
    batch = {"pair": Pair(x, torch.arange(5)), "names": ["a"], "scale": 2.0, "t": (x, torch.zeros(3))}
    parts = split_batch(batch, 2)
    assert [batch_len(p) for p in parts] == [3, 2]
    assert isinstance(parts[0]["pair"], Pair)
    assert torch.equal(torch.cat([p["pair"].x for p in parts]), x)
    assert all(p["scale"] == 2.0 and p["names"] == ["a"] for p in parts)
    assert all(p["t"][1].shape == (3,) for p in parts)  # not the batch's length: given whole to each part
    assert len(split_batch((torch.zeros(3, 1),), 8)) == 3  # never an empty micro-batch
    assert split_batch(x, 1)[0] is x


def test_build_rungs_order() -> None:
    assert [r.name for r in build_rungs(8)] == [
        "full",
        "micro2",
        "micro4",
        "micro8",
        "micro8+act-host",
        "micro8+act-host+opt-host",
    ]
    assert [r.name for r in build_rungs(1)] == ["full", "full+act-host", "full+act-host+opt-host"]
    with pytest.raises(ValueError):
        build_rungs(0)


# -- the ladder's bookkeeping ----------------------------------------------------------------------------------------
def test_ladder_moves_down_on_a_smaller_cap_from_measurements() -> None:
    ladder = Ladder(build_rungs(4))  # full, micro2, micro4, +act, +opt
    for i, peak in enumerate([100, 70, 50, 30, 20]):
        ladder.peak_mib[i] = peak
    ladder.set_cap(60)
    assert ladder.rung.name == "micro4"  # straight to the first rung that fits: no out-of-memory needed
    ladder.set_cap(25)
    assert ladder.rung.name == "micro4+act-host+opt-host"
    ladder.set_cap(200)
    for want in ["micro4+act-host", "micro4", "micro2", "full", "full"]:
        ladder.succeeded(ladder.index, ladder.peak_mib[ladder.index])
        assert ladder.rung.name == want  # one rung per step
    assert ladder.need_mib == 100


def test_ladder_does_not_retry_a_rung_that_failed_under_this_cap() -> None:
    ladder = Ladder(build_rungs(2))
    ladder.set_cap(50)
    ladder.ran_out(0)
    assert ladder.index == 1
    ladder.succeeded(1, 40)
    assert ladder.index == 1  # "full" failed under 50: not tried again under 50
    assert ladder.need_mib == 51  # a lower bound: more than the cap it failed under
    ladder.set_cap(51)
    ladder.succeeded(1, 40)
    assert ladder.index == 0  # a larger cap: worth a try
    with pytest.raises(LadderExhausted):
        ladder.set_cap(10)
        for i in range(len(ladder.rungs)):
            ladder.ran_out(i)


# -- walking the ladder with the device-memory seam ----------------------------------------------------------------
def test_shrinking_the_cap_walks_down_the_ladder_and_growing_it_climbs_back() -> None:
    # SGD with momentum: its update is linear in the gradient, so float rounding differences between rungs stay
    # rounding-sized over many steps (Adam's normalisation would amplify them where gradients are near zero).
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    dev = SimulatedDevice(capacity_mib=4096)
    job = Job(model=model, optimizer=opt, device=dev, env={}, verbose=False, max_micro_batches=8)
    batch = make_batch(n=4096)  # activations well above the model's state, so that each rung matters

    def run_step() -> None:
        with job.step():
            job.train_step(batch, loss_of(model))
        ref_opt.zero_grad()
        loss_of(ref)(batch).backward()
        ref_opt.step()

    run_step()
    assert job.mem_mode == "full"
    full_peak = dev.step_peak_mib()
    # Cap in steps: each one below what the rung in use was measured to need. Every rung must still train.
    modes = [job.mem_mode]
    peaks = [full_peak]
    for _ in range(12):
        cap = peaks[-1] - 1
        job.mem_limit_mib = cap
        job._apply_limits()
        try:
            run_step()
        except torch.OutOfMemoryError:
            break  # below the last rung: nothing fits
        assert dev.step_peak_mib() <= cap
        modes.append(job.mem_mode)
        peaks.append(dev.step_peak_mib())
    assert dev.ooms > 0  # the seam raised PyTorch's own error, and the job went on a rung lower
    assert modes[:4] == ["full", "micro2", "micro4", "micro8"]
    assert modes[-2:] == ["micro8+act-host", "micro8+act-host+opt-host"]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < full_peak / 2
    # The same update on every rung (6 steps, each at a different rung): within float tolerance.
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert job._elastic is not None and job._elastic.residency.optimizer_on_host

    job.mem_limit_mib = 4096
    job._apply_limits()
    climbed = []
    for _ in range(8):
        climbed.append(job.mem_mode)  # the rung the next step runs at
        run_step()
    assert climbed[: len(modes)] == modes[::-1]  # back up one rung per step, the way it came down
    assert climbed[-1] == "full"
    assert not job._elastic.residency.optimizer_on_host
    assert all(not dev.is_host(t) for st in opt.state.values() for t in st.values() if t.dim() > 0)
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_step_that_cannot_fit_at_all_raises_the_real_error_with_a_note() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dev = SimulatedDevice(capacity_mib=1)  # not even the parameters fit
    job = Job(model=model, optimizer=opt, device=dev, env={}, verbose=False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(torch.OutOfMemoryError) as info, job.step():
        job.train_step(make_batch(), loss_of(model))
    assert any("memory ladder is exhausted" in n for n in getattr(info.value, "__notes__", []))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # nothing updated


def test_train_step_needs_an_optimizer() -> None:
    job = Job(model=make_model(), env={}, verbose=False)
    with pytest.raises(RuntimeError, match="optimizer"):
        job.train_step(make_batch(), lambda b: b[0].sum())


def test_report_carries_need_and_mode_under_a_cap() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dev = SimulatedDevice(capacity_mib=4096)
    job = Job(model=model, optimizer=opt, device=dev, env={}, verbose=False)
    batch = make_batch()
    with job.step():
        job.train_step(batch, loss_of(model))
    need = job._elastic.ladder.need_mib if job._elastic else None
    assert need is not None and need > 0
    job.mem_limit_mib = need - 1
    job._apply_limits()
    assert job.mem_cap_mib == need - 1
    with job.step():
        job.train_step(batch, loss_of(model))
    assert job.mem_mode != "full" and job._elastic is not None and job._elastic.ladder.need_mib == need


# -- eviction ------------------------------------------------------------------------------------------------------
def train(model: Any, opt: Any, steps: int, seed: int) -> None:
    for i in range(steps):
        batch = make_batch(seed=seed + i, n=64)
        opt.zero_grad()
        loss_of(model)(batch).backward()
        opt.step()


def test_evict_and_restore_are_bit_exact_and_release_device_memory() -> None:
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    train(ref, ref_opt, 6, seed=10)

    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dev = SimulatedDevice(capacity_mib=4096)
    residency = Residency(model, opt, dev)
    dev.attach(residency)
    train(model, opt, 3, seed=10)
    params = list(model.parameters())
    held_before = dev.held_bytes()
    snapshot = state_tensors(model, opt)
    residency.evict()
    assert residency.evicted and dev.held_bytes() == 0 < held_before
    assert all(dev.is_host(p) for p in params)
    residency.restore()
    assert dev.held_bytes() == held_before
    assert list(model.parameters()) == params  # the same Parameter objects: the optimizer still holds them
    assert all(torch.equal(a, b) for a, b in zip(snapshot, state_tensors(model, opt), strict=True))
    train(model, opt, 3, seed=13)
    assert all(torch.equal(a, b) for a, b in zip(state_tensors(ref, ref_opt), state_tensors(model, opt), strict=True))


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "pipelined"])
def test_an_evicting_pause_from_the_agent_moves_the_state_out_and_back(peer: Any, pipelined: bool) -> None:
    """``Pause(evict=True)`` over the real channel: the job gives its device memory back, says so and how long
    it took, and after ``Resume`` trains on exactly as if it had never stopped (also with a pipelined restore,
    settled at the next boundary)."""
    from job_agent_peer import Runner, agent_env, wait_until

    from corral.core import contract

    steps = 40
    batches = [make_batch(seed=100 + i, n=64) for i in range(steps)]
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    for b in batches:
        ref_opt.zero_grad()
        loss_of(ref)(b).backward()
        ref_opt.step()

    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dev = SimulatedDevice(capacity_mib=4096)
    env = agent_env(peer, **{contract.ENV_REPORT_INTERVAL_S: "0.05"})
    job = Job(
        model=model, optimizer=opt, device=dev, env=env, handle_sigterm=False, verbose=False,
        pipelined_restore=pipelined,
    )  # fmt: skip
    gate = threading.Event()

    def body() -> None:
        with job:
            for i, b in enumerate(job.loop(batches)):
                job.train_step(b, loss_of(model))
                if i == 5:
                    gate.wait(15)  # hold here until the pause is on its way: it lands at the next boundary

    runner = Runner(body)
    peer.expect(contract.Hello)
    peer.send(contract.Pause(reason="reclaim", evict=True))
    gate.set()
    paused = peer.expect(contract.Paused)
    assert paused.evicted and paused.took_s is not None and paused.took_s >= 0
    wait_until(lambda: job.evicted)
    assert dev.held_bytes() == 0
    assert all(dev.is_host(p) for p in model.parameters())
    peer.send(contract.Resume())
    resumed = peer.expect(contract.Resumed)
    assert resumed.took_s is not None and resumed.step == paused.step
    assert runner.join() == 0
    assert not job.evicted
    assert all(torch.equal(a, b) for a, b in zip(state_tensors(ref, ref_opt), state_tensors(model, opt), strict=True))
    reports = peer.received(contract.StepReport)
    assert reports and all(r.mem_mode == "full" and r.mem_need_mib for r in reports)
    log = [kind for kind, _ in dev.pipeline_log]
    assert (log.count("mark") >= 2 and log[-1] == "finish") if pipelined else not log


def test_a_plain_pause_keeps_device_memory(peer: Any) -> None:
    from job_agent_peer import Runner, agent_env

    from corral.core import contract

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dev = SimulatedDevice(capacity_mib=4096)
    job = Job(model=model, optimizer=opt, device=dev, env=agent_env(peer), handle_sigterm=False, verbose=False)
    stop = threading.Event()

    def body() -> None:
        with job:
            for b in job.loop(itertools.repeat(make_batch(n=32))):
                job.train_step(b, loss_of(model))
                if stop.is_set():
                    break

    runner = Runner(body)
    peer.expect(contract.Hello)
    peer.send(contract.Pause(reason="time slice"))
    paused = peer.expect(contract.Paused)
    assert not paused.evicted and paused.took_s is None
    assert dev.held_bytes() > 0 and not job.evicted
    peer.send(contract.Resume())
    assert peer.expect(contract.Resumed).took_s is None
    stop.set()
    assert runner.join() == 0
