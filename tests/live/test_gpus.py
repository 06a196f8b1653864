"""GPU discovery and sampling: stand-ins, the errors without NVML, and the NVML path through a fake ``pynvml``
(no GPU exists where these tests run; the fake stands at the module seam ``discover_gpus``/``GpuSampler`` use)."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from corral.core.errors import ConfigError
from corral.live.agent.gpus import GpuInfo, GpuSample, GpuSampler, discover_gpus

MIB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


@dataclass
class _Mem:
    total: int
    used: int


@dataclass
class _Util:
    gpu: int
    memory: int = 0


def fake_pynvml(
    devices: list[tuple[str | bytes, int, int, int]],
    *,
    init_error: str | None = None,
    broken: frozenset[int] = frozenset(),
    procs: dict[int, list[tuple[int, int | None, list[tuple[int, int]]]]] | None = None,
) -> types.ModuleType:
    """A ``pynvml`` with ``devices`` as (name, total MiB, used MiB, utilisation %); ``broken`` ones fail to sample.
    ``procs``: per GPU, its processes as (pid, used MiB or None, [(timestamp µs, SM %), ...] utilisation samples).
    """
    mod = types.ModuleType("pynvml")
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def handle(i: int) -> int:
        if not 0 <= i < len(devices):
            raise FakeNVMLError("Invalid Argument")
        return i

    def checked(i: int) -> int:
        if i in broken:
            raise FakeNVMLError("GPU is lost")
        return i

    def process_util(h: int, since: int) -> list[Any]:
        found = [
            types.SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm)
            for pid, _, samples in (procs or {}).get(checked(h), [])
            for ts, sm in samples
            if ts > since
        ]
        if not found:
            raise FakeNVMLError("Not Found")
        return found

    fns: dict[str, Callable[..., Any]] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: devices[h][0],
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h:08d}",
        "nvmlDeviceGetMemoryInfo": lambda h: _Mem(devices[checked(h)][1] * MIB, devices[h][2] * MIB),
        "nvmlDeviceGetUtilizationRates": lambda h: _Util(devices[checked(h)][3]),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=None if mem is None else mem * MIB)
            for pid, mem, _ in (procs or {}).get(checked(h), [])
        ],
        "nvmlDeviceGetProcessUtilization": process_util,
    }
    for name, fn in fns.items():
        setattr(mod, name, fn)
    mod.calls = calls  # type: ignore[attr-defined]
    return mod


def test_stand_ins() -> None:
    gpus = discover_gpus(stand_in=3, stand_in_mem_mib=8192)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert all(g.stand_in and g.uuid is None and g.name == "stand-in" and g.mem_mib == 8192 for g in gpus)
    assert gpus[0].type_name == "stand-in"


@pytest.mark.parametrize("bad", [0, -1, 4097, True, 2.0])
def test_bad_stand_in_count(bad: Any) -> None:
    with pytest.raises(ConfigError, match="--gpus"):
        discover_gpus(stand_in=bad)


def test_no_nvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(ConfigError) as e:
        discover_gpus()
    assert "no NVIDIA GPU" in str(e.value) and "nvidia-ml-py is not installed" in str(e.value)
    assert "--gpus N" in str(e.value)


def test_nvml_fails_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error="Driver Not Loaded"))
    with pytest.raises(ConfigError, match=r"Driver Not Loaded.*--gpus N"):
        discover_gpus()


def test_nvml_without_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml([])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(ConfigError, match=r"0 devices.*--gpus N"):
        discover_gpus()
    assert nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]


def test_nvml_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml([("NVIDIA H100 80GB HBM3", 81559, 0, 0), (b"Tesla V100-SXM2-16GB", 16160, 0, 0)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = discover_gpus()
    assert gpus == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, "GPU-00000000", False),
        GpuInfo(1, "Tesla V100-SXM2-16GB", 16160, "GPU-00000001", False),
    ]
    assert [g.type_name for g in gpus] == ["H100-80GB", "V100-16GB"]
    assert nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "mem_mib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("Tesla V100-PCIE-32GB", 32510, "V100-32GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090-24GB"),
        ("NVIDIA RTX A6000", 49140, "RTX-A6000-48GB"),
        ("NVIDIA L40S", 46068, "L40S-45GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
    ],
)
def test_type_names(name: str, mem_mib: int, expected: str) -> None:
    assert GpuInfo(0, name, mem_mib, "GPU-x", False).type_name == expected


def test_sampler(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    nvml = fake_pynvml(
        [("NVIDIA H100 80GB HBM3", 81559, 1200, 50), ("NVIDIA H100 80GB HBM3", 81559, 0, 0)], broken=frozenset({1})
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, "a", False),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", 81559, "b", False),
    ]
    sampler = GpuSampler(gpus)
    with caplog.at_level(logging.WARNING, logger="corral.live.agent.gpus"):
        first = sampler.sample()
        second = sampler.sample()
    assert first == second == [GpuSample(0, 0.5, 1200), GpuSample(1, None, None)]
    assert sum("GPU is lost" in r.getMessage() for r in caplog.records) == 1  # warned once, not per sample
    sampler.close()
    sampler.close()
    assert nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]


def test_sampler_on_stand_ins_needs_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sampler = GpuSampler(discover_gpus(stand_in=2))
    assert sampler.sample() == [GpuSample(0, None, None), GpuSample(1, None, None)]
    sampler.close()


def test_process_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = {
        0: [(101, 900, [(10, 40), (20, 60)]), (102, None, [])],
        1: [(101, 500, [(15, 30)])],
    }
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("H100", 81559, 0, 0)] * 2, procs=procs))
    sampler = GpuSampler([GpuInfo(0, "H100", 81559, "u0", False), GpuInfo(1, "H100", 81559, "u1", False)])
    got = sampler.processes()
    assert [(p.index, p.pid, p.mem_used_mib) for p in got] == [(0, 101, 900), (0, 102, None), (1, 101, 500)]
    assert got[0].sm_util == pytest.approx(0.5) and got[1].sm_util is None and got[2].sm_util == pytest.approx(0.3)
    again = sampler.processes()  # no utilisation sample since the last call: memory only
    assert [p.sm_util for p in again] == [None, None, None]
    sampler.close()


def test_process_samples_skip_stand_ins_and_broken_gpus(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("H100", 81559, 0, 0)], broken=frozenset({0})))
    sampler = GpuSampler([GpuInfo(0, "H100", 81559, "u0", False), *discover_gpus(stand_in=1)])
    with caplog.at_level(logging.WARNING):
        assert sampler.processes() == [] and sampler.processes() == []
    assert sum("cannot list the processes" in r.message for r in caplog.records) == 1
