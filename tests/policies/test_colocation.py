"""The co-location table: Gavel's measured throughputs read where they lie, normalised, mapped and with fallbacks.

Figures below are read off ``shared/data/gavel-throughputs/simulation_throughputs.json`` by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.core.errors import ConfigError
from corral.workloads.colocation import (
    FALLBACK_RATES,
    GAVEL_GPUS,
    ColocationTable,
    gavel_gpu,
    load_colocation,
    pair_rates,
)
from corral.workloads.models import MODELS

R18 = "ResNet-18 (batch size 64)"
R50 = "ResNet-50 (batch size 64)"
LM = "LM (batch size 20)"


@pytest.fixture(scope="module")
def table() -> ColocationTable:
    return load_colocation()


def test_the_table_has_every_single_gpu_job_type_on_each_gpu(table: ColocationTable) -> None:
    assert set(table.isolated) == set(GAVEL_GPUS) == set(table.packed)
    assert len(table.job_types) == 26
    for gpu in GAVEL_GPUS:
        assert len(table.isolated[gpu]) == 26
        assert len(table.packed[gpu]) == 26 * 26  # every ordered pair was measured
    assert table.isolated["v100"][R50] == pytest.approx(4.3948, abs=1e-4)
    assert table.source.endswith("simulation_throughputs.json")


def test_the_table_is_read_only_and_shared(table: ColocationTable) -> None:
    assert load_colocation() is table  # cached: one table per process
    with pytest.raises(TypeError):
        table.isolated["v100"][R50] = 1.0  # type: ignore[index]
    with pytest.raises(AttributeError):
        table.source = "x"  # type: ignore[misc]


def test_pairs_are_symmetric_and_normalised(table: ColocationTable) -> None:
    for gpu in GAVEL_GPUS:
        for a in (R18, R50, LM):
            for b in (R18, R50, LM):
                ab, ba = table.rates(a, b, gpu), table.rates(b, a, gpu)
                assert ab is not None and ba is not None
                assert ab == (ba[1], ba[0])
                assert all(0.0 <= r <= 1.0 for r in ab)
    # ResNet-50 beside ResNet-18 on a V100: 3.553 of 4.395 steps/s and 12.439 of 24.093.
    r50, r18 = table.rates(R50, R18, "v100") or (0.0, 0.0)
    assert r50 == pytest.approx(0.809, abs=1e-3)
    assert r18 == pytest.approx(0.516, abs=1e-3)
    # Two ResNet-50s on a V100 just take turns.
    assert table.rates(R50, R50, "v100") == pytest.approx((0.5, 0.5), abs=0.01)


def test_a_pair_that_did_not_fit_reads_zero(table: ColocationTable) -> None:
    # ResNet-50 with CycleGAN on a K80: the file says [0.0, 0.0] (out of memory).
    assert table.rates(R50, "CycleGAN", "k80") == (0.0, 0.0)


def test_unmeasured_pairs_are_none(table: ColocationTable) -> None:
    assert table.rates(R50, "Not A Model", "v100") is None
    assert table.rates(R50, R18, "a100") is None


@pytest.mark.parametrize(
    ("name", "mem_mib", "speed", "gavel"),
    [
        ("K80", 12 * 1024, 0.25, "k80"),
        ("P100", 16 * 1024, 0.8, "p100"),
        ("V100-32GB", 32 * 1024, 1.0, "v100"),
        ("tesla-p100-pcie", 16 * 1024, 3.0, "p100"),  # the name wins over the speed
        ("gpu", 16 * 1024, 1.0, "v100"),  # Tiresias presets and NxG clusters
        ("12GB", 12 * 1024, 1.0, "v100"),  # Philly: speed 1.0 for both kinds
        ("T4", 16 * 1024, 0.4, "k80"),  # 0.4 is nearer 0.25 than 0.8
        ("A100-40GB", 40 * 1024, 2.0, "v100"),  # faster than anything Gavel measured: the fastest it did
        ("mid", 12 * 1024, 0.9, "p100"),  # as near V100's speed as P100's: the memory decides (K80 12, P100 16)
        ("H100-80GB", 80 * 1024, 4.0, "v100"),
    ],
)
def test_gpu_types_map_to_the_nearest_gavel_gpu(name: str, mem_mib: int, speed: float, gavel: str) -> None:
    assert gavel_gpu(name, mem_mib, speed) == gavel


def test_pair_rates_go_through_the_model_catalogue(table: ColocationTable) -> None:
    # googlenet stands in as ResNet-18, vgg16 as ResNet-50 (workloads.models).
    assert MODELS["googlenet"].colocation_type == R18
    assert pair_rates(table, "vgg16", "googlenet", "v100") == table.rates(R50, R18, "v100")
    assert pair_rates(table, "ResNet-50", "resnet_18", "v100") == table.rates(R50, R18, "v100")


@pytest.mark.parametrize(
    ("a", "b"), [(None, "resnet50"), ("resnet50", None), ("mystery-net", "resnet50"), (None, None)]
)
def test_unknown_models_fall_back_to_no_gain(table: ColocationTable, a: str | None, b: str | None) -> None:
    assert pair_rates(table, a, b, "v100") == FALLBACK_RATES == (0.5, 0.5)
    assert sum(FALLBACK_RATES) == 1.0  # exactly what taking turns gives: never predicted to gain


def _write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_small_file_is_read_and_other_scale_factors_are_ignored(tmp_path: Path) -> None:
    rows = {
        "('A', 1)": {"null": 2.0, "('A', 1)": [1.0, 1.0], "('B', 1)": [1.5, 3.0], "('B', 2)": [9.0, 9.0]},
        "('B', 1)": {"null": 4.0, "('A', 1)": [3.0, 1.5], "('B', 1)": [2.0, 2.0]},
        "('A', 2)": {"null": 3.0},
    }
    t = load_colocation(_write(tmp_path, {g: rows for g in GAVEL_GPUS}))
    assert t.job_types == ("A", "B")
    assert t.rates("A", "B", "p100") == (0.75, 0.75)
    assert t.rates("B", "B", "k80") == (0.5, 0.5)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "expected a JSON object"),
        ({"k80": {}}, "no measurements for GPU type 'p100'"),
        ({g: {"A": {"null": 1.0}} for g in GAVEL_GPUS}, "expected a key like"),
        ({g: {"('A', 1)": {"x": 1.0}} for g in GAVEL_GPUS}, "isolated throughput under 'null'"),
        ({g: {"('A', 1)": {"null": 1.0, "('A', 1)": [1.0]}} for g in GAVEL_GPUS}, "expected \\[own, partner\\]"),
    ],
)
def test_bad_files_are_errors_that_name_the_file(tmp_path: Path, data: object, message: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError, match=message) as info:
        load_colocation(path)
    assert path in str(info.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read co-location throughputs"):
        load_colocation(str(tmp_path / "nope.json"))
