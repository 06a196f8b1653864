"""Cluster specifications: turn a preset name, an inline ``NxG`` form or a TOML file into a :class:`Cluster`.

Three ways to say which cluster to simulate (:func:`load_cluster` takes any of them):

- a **preset** built from the real machine lists in the shared data folder: ``philly`` and ``philly-revised``
  (Microsoft Philly, ATC'19), ``openb`` (Alibaba's GPU-sharing cluster, ATC'23), and the Tiresias (NSDI'19)
  specs ``n32g4``, ``n1g4``, ``n160g8``, ``n256g8``, ``cluster_spec`` (any ``nNgG`` file that exists);
- the **inline** form ``NxG`` (N nodes of G GPUs) or ``NxG:TYPE`` with a type from :data:`BUILTIN_GPU_TYPES`;
- a **TOML file** in the small declarative format of ``docs/clusters.md`` (:func:`load_cluster_file`).

:func:`with_quotas` then gives a cluster the tenants and GPU quotas of an experiment (the Philly VCs scaled to
fit, an equal split among a trace's tenants, or explicit numbers); :func:`describe_quotas` says what it did.

The data files say nothing about racks, PCIe switches or (for some machines) GPU memory, so every preset fills
those gaps with an assumption written next to the code that makes it and in ``docs/clusters.md``. Every
problem with a spec raises :class:`ClusterSpecError` naming the file, line where we can find it cheaply, the
key path (``nodes[2].gpus``), the expected form and what was found, because a cluster file is edited by hand.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from corral.core.cluster import Cluster, GpuType, NodeSpec
from corral.core.errors import ClusterSpecError, ConfigError, TomlError
from corral.core.tenant import Tenant
from corral.core.toml import decode_toml, parse_toml
from corral.core.wording import plural
from corral.workloads.data import data_dir, data_file

__all__ = [
    "BUILTIN_GPU_TYPES",
    "DEFAULT_GPU_TYPE",
    "INLINE_RACK_SIZE",
    "MAX_GPUS",
    "MAX_GPUS_PER_NODE",
    "MAX_NODES",
    "OPENB_GPU_MEM_MIB",
    "OPENB_RACK_SIZE",
    "PHILLY_RACK_SIZE",
    "PRESETS",
    "QUOTA_FORMS",
    "describe_cluster",
    "describe_quotas",
    "load_cluster",
    "load_cluster_file",
    "parse_cluster_toml",
    "philly_vc_tenants",
    "preset_names",
    "with_quotas",
]

_GIB: Final = 1024  # MiB per GiB

# ---------------------------------------------------------------------------------------------------------
# Size limits. A cluster is built node by node, so a file saying ``count = 100000000`` would otherwise spend
# minutes and gigabytes before anything could go wrong. The limits are far above any real cluster (the largest
# training clusters of 2024 have about 100,000 GPUs, on 8 per node) and low enough that building the largest
# allowed cluster takes seconds: 1,000,000 GPUs on 200,000 nodes of 5 take about 2 s and 100 MiB here.
# ---------------------------------------------------------------------------------------------------------

MAX_NODES: Final = 200_000  # nodes in one cluster
MAX_GPUS_PER_NODE: Final = 1_024  # GPUs in one node (an NVL72 rack seen as one node has 72)
MAX_GPUS: Final = 1_000_000  # GPUs in one cluster, all nodes together
_COUNT_CLAMP: Final = 10**9  # an inline count this large or larger is only said to be "at least" this


def _size_problem(num_nodes: int, gpus_per_node: int, total_gpus: int) -> tuple[str, str] | None:
    """(what is too large, "at most" the limit) for a cluster of this size, or None when it is within limits."""
    if num_nodes > MAX_NODES:
        return f"{_at_least(num_nodes)} nodes", f"at most {MAX_NODES:,} nodes in a cluster (corral's limit)"
    if gpus_per_node > MAX_GPUS_PER_NODE:
        return (
            f"{_at_least(gpus_per_node)} GPUs in one node",
            f"at most {MAX_GPUS_PER_NODE:,} GPUs per node (corral's limit)",
        )
    if total_gpus > MAX_GPUS:
        return f"{_at_least(total_gpus)} GPUs", f"at most {MAX_GPUS:,} GPUs in a cluster (corral's limit)"
    return None


def _at_least(n: int) -> str:
    return f"at least {_COUNT_CLAMP:,}" if n >= _COUNT_CLAMP else f"{n:,}"


# ---------------------------------------------------------------------------------------------------------
# Built-in GPU types (for ``NxG:TYPE`` and for TOML files that name a type without defining it).
#
# Memory is the nominal size in GiB x 1024 (nvidia-smi reports a few hundred MiB less). Speed is relative
# throughput with V100 = 1.0. K80 and P100 are the medians, over Gavel's 26 single-GPU job types, of measured
# isolated throughput relative to V100 (shared/data/gavel-throughputs: K80 0.247, P100 0.813), rounded. The
# newer types are not in any data we ship: their speeds are rough, rounded assumptions (see docs/clusters.md)
# and a TOML file can override them.
# ---------------------------------------------------------------------------------------------------------

DEFAULT_GPU_TYPE: Final = GpuType("gpu", 16 * _GIB, 1.0)  # the anonymous GPU of NxG and of Tiresias specs

BUILTIN_GPU_TYPES: Final[Mapping[str, GpuType]] = MappingProxyType(
    {
        t.name: t
        for t in (
            DEFAULT_GPU_TYPE,
            GpuType("K80", 12 * _GIB, 0.25),  # one of the two GPUs on a K80 board
            GpuType("P100", 16 * _GIB, 0.8),
            GpuType("T4", 16 * _GIB, 0.4),
            GpuType("A10", 24 * _GIB, 0.9),
            GpuType("V100-16GB", 16 * _GIB, 1.0),
            GpuType("V100-32GB", 32 * _GIB, 1.0),
            GpuType("A100-40GB", 40 * _GIB, 2.0),
            GpuType("A100-80GB", 80 * _GIB, 2.0),
            GpuType("H100-80GB", 80 * _GIB, 4.0),
        )
    }
)
_BUILTIN_BY_LOWER: Final = {name.lower(): t for name, t in BUILTIN_GPU_TYPES.items()}


def _builtin_gpu_type(name: str) -> GpuType | None:
    return _BUILTIN_BY_LOWER.get(name.lower())


def _pcie_switch_size(num_gpus: int) -> int | None:
    """GPUs per PCIe switch for a machine the data describes only by its GPU count.

    Common 8-GPU servers hang their GPUs off two PCIe switches of four (Philly's 8-GPU machines are modelled
    this way); machines with four GPUs or fewer are taken to have one switch. ``None`` = one switch per node.
    """
    return 4 if num_gpus > 4 else None


# ---------------------------------------------------------------------------------------------------------
# Small CSV helpers: every data-file error names the file, line and column.
# ---------------------------------------------------------------------------------------------------------


def _csv_rows(path: Path, header: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) for each data row, after checking the header; cells are stripped."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f, skipinitialspace=True)
        first = next(reader, None)
        got = [c.strip() for c in first] if first is not None else []
        if got != header:
            raise ClusterSpecError(
                "unexpected header", file=str(path), line=1, expected=",".join(header), got=",".join(got)
            )
        for cells in reader:
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ClusterSpecError(
                    f"wrong number of fields: {len(cells)} where the header has {len(header)}",
                    file=str(path),
                    line=reader.line_num,
                    expected=f"{len(header)} fields, as in the header: {','.join(header)}",
                    got=",".join(cells),
                )
            yield reader.line_num, [c.strip() for c in cells]


def _csv_int(path: Path, line: int, column: str, text: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    # int() also reads "1_000" and other scripts' digits: a data file writes 0-9 only (as the trace readers require).
    if value is None or value < minimum or "_" in text or not text.isascii():
        raise ClusterSpecError(
            "bad value",
            file=str(path),
            line=line,
            column=column,
            expected=f"an integer >= {minimum}",
            got=text,
        )
    return value


def _in_racks(nodes_in_order: Iterable[tuple[str, str]], per_rack: int) -> dict[str, str]:
    """Node name -> rack name, putting every ``per_rack`` consecutive nodes of the same kind in a new rack.

    ``nodes_in_order`` yields (node name, kind); the rack is named ``rack-<kind>-<k>`` (``rack-<k>`` when
    the kind is empty).
    """
    seen: Counter[str] = Counter()
    racks: dict[str, str] = {}
    for node, kind in nodes_in_order:
        k = seen[kind] // per_rack
        seen[kind] += 1
        racks[node] = f"rack-{kind}-{k}" if kind else f"rack-{k}"
    return racks


# ---------------------------------------------------------------------------------------------------------
# Philly (Jeon et al., ATC'19; the public trace of msr-fiddle/philly-traces).
# ---------------------------------------------------------------------------------------------------------

PHILLY_RACK_SIZE: Final = 16  # machines per rack: an assumption, the trace has no rack data
_GB_RE: Final = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def _philly_machine_list() -> list[tuple[str, int, str]]:
    """(machineId, GPUs, GPU type name) from philly/cluster_machine_list.csv, in file order.

    The trace names no GPU model, only the memory ("12GB", "24GB"), so that string is the type's name.
    """
    path = data_file("philly", "cluster_machine_list.csv")
    out: list[tuple[str, int, str]] = []
    for line, (machine, gpus, mem) in _csv_rows(path, ["machineId", "number of GPUs", "single GPU mem"]):
        m = _GB_RE.fullmatch(mem)
        if m is None:
            raise ClusterSpecError(
                "bad GPU memory",
                file=str(path),
                line=line,
                column="single GPU mem",
                expected="like 12GB",
                got=mem,
            )
        out.append((machine, _csv_int(path, line, "number of GPUs", gpus), f"{int(m.group(1))}GB"))
    return out


def _philly_gpu_type(name: str) -> GpuType:
    # Speed 1.0 for both kinds: the trace's durations were measured on whatever each job ran on, so scaling
    # them by a per-type speed would count the hardware twice. Heterogeneity in speed is off by default.
    gb = _GB_RE.fullmatch(name)
    assert gb is not None  # names come from _philly_machine_list, which checked them
    return GpuType(name, int(gb.group(1)) * _GIB, 1.0)


def _philly_vc_names() -> list[tuple[str, int]]:
    path = data_file("philly", "philly_vc.csv")
    return [(vc, _csv_int(path, line, "node num", nodes)) for line, (vc, nodes) in _csv_rows(path, ["vc", "node num"])]


def philly_vc_tenants() -> tuple[Tenant, ...]:
    """The 11 large Philly virtual clusters of philly/philly_vc.csv, each with quota ``node num x 8`` GPUs.

    The node counts sum to 352 nodes = 2,816 GPUs: more than the 2,490 GPUs of ``philly`` (the quotas
    overcommit it by 326 GPUs) and less than the 3,205 of ``philly-revised``. The ``philly`` presets leave
    quotas off because the trace's whole-cluster replay enforced none; use this for quota experiments.
    """
    return tuple(Tenant(vc, nodes * 8) for vc, nodes in _philly_vc_names())


def _philly_tenants() -> tuple[Tenant, ...]:
    return tuple(Tenant(vc) for vc, _ in _philly_vc_names())


def _philly_cluster(name: str, machines: list[tuple[str, int, str]]) -> Cluster:
    """Nodes from (machineId, GPUs, type) in file order, racked by GPU type in groups of 16."""
    kept = [m for m in machines if m[1] > 0]  # machines with no GPU cannot run a job; leave them out
    racks = _in_racks(((m, t) for m, _, t in kept), PHILLY_RACK_SIZE)
    type_names = list(dict.fromkeys(t for _, _, t in kept))
    nodes = tuple(
        NodeSpec(machine, gpu_type, gpus, rack=racks[machine], gpus_per_switch=_pcie_switch_size(gpus))
        for machine, gpus, gpu_type in kept
    )
    return Cluster(name, tuple(_philly_gpu_type(t) for t in type_names), nodes, _philly_tenants())


def _load_philly() -> Cluster:
    return _philly_cluster("philly", _philly_machine_list())


def _load_philly_revised() -> Cluster:
    """philly/revised_machine_list.csv: GPU counts re-derived from the GPU-utilization logs (3,205 GPUs).

    That file has no memory column. Each machine keeps the GPU type (memory) the original machine list gives
    the same machineId: the only memory information there is, though unverified for machines whose GPU count
    the revision changed. Its 13 machines with 0 GPUs are left out.
    """
    original = {machine: gpu_type for machine, _, gpu_type in _philly_machine_list()}
    path = data_file("philly", "revised_machine_list.csv")
    machines: list[tuple[str, int, str]] = []
    for line, (_, machine, gpus) in _csv_rows(path, ["", "machineId", "number of GPUs"]):
        if machine not in original:
            raise ClusterSpecError(
                "machine not in philly/cluster_machine_list.csv, so its GPU memory is unknown",
                file=str(path),
                line=line,
                column="machineId",
                expected="a machineId of the original machine list",
                got=machine,
            )
        machines.append((machine, _csv_int(path, line, "number of GPUs", gpus), original[machine]))
    return _philly_cluster("philly-revised", machines)


# ---------------------------------------------------------------------------------------------------------
# Alibaba openb (Weng et al., "Beware of Fragmentation", ATC'23).
# ---------------------------------------------------------------------------------------------------------

OPENB_RACK_SIZE: Final = 32  # nodes per rack: an assumption, the trace has no rack data

# GPU memory per model, in MiB, from the vendors' data sheets. G2 and G3 are "undisclosed internal GPU codes"
# (the trace's README); we assume 16 GiB, the smallest memory of any disclosed model in the trace, so that a
# replay never packs more onto them than a real GPU could hold. A TOML file can say otherwise.
OPENB_GPU_MEM_MIB: Final[Mapping[str, int]] = MappingProxyType(
    {
        "P100": 16 * _GIB,
        "T4": 16 * _GIB,
        "V100M16": 16 * _GIB,
        "V100M32": 32 * _GIB,
        "A10": 24 * _GIB,
        "G1": 16 * _GIB,  # named by the README, absent from the node list
        "G2": 16 * _GIB,
        "G3": 16 * _GIB,
    }
)


def _load_openb() -> Cluster:
    path = data_file("alibaba-openb", "openb_node_list_gpu_node.csv")
    nodes: list[NodeSpec] = []
    type_names: dict[str, None] = {}
    for line, (sn, cpu_milli, memory_mib, gpu, model) in _csv_rows(
        path, ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
    ):
        num_gpus = _csv_int(path, line, "gpu", gpu)
        if num_gpus == 0:  # CPU-only nodes (none in the GPU-node list, but the all-node list has 310)
            continue
        if model not in OPENB_GPU_MEM_MIB:
            raise ClusterSpecError(
                "unknown GPU model",
                file=str(path),
                line=line,
                column="model",
                expected=f"one of {', '.join(OPENB_GPU_MEM_MIB)}",
                got=model,
            )
        type_names[model] = None
        nodes.append(
            NodeSpec(
                sn,
                model,
                num_gpus,
                rack=f"rack-{len(nodes) // OPENB_RACK_SIZE}",
                gpus_per_switch=_pcie_switch_size(num_gpus),
                cpu_milli=_csv_int(path, line, "cpu_milli", cpu_milli),
                host_mem_mib=_csv_int(path, line, "memory_mib", memory_mib),
            )
        )
    # Speed 1.0 for every model: the trace gives no durations measured per model to scale.
    gpu_types = tuple(GpuType(m, OPENB_GPU_MEM_MIB[m], 1.0) for m in OPENB_GPU_MEM_MIB if m in type_names)
    return Cluster("openb", gpu_types, tuple(nodes))


# ---------------------------------------------------------------------------------------------------------
# Tiresias (Gu et al., NSDI'19) cluster specs: one row of num_switch,num_node_p_switch,num_gpu_p_node,...
# ---------------------------------------------------------------------------------------------------------

_TIRESIAS_HEADER: Final = [
    "num_switch",
    "num_node_p_switch",
    "num_gpu_p_node",
    "num_cpu_p_node",
    "mem_p_node",
]
_TIRESIAS_NAME_RE: Final = re.compile(r"n\d+g\d+|cluster_spec")


def _tiresias_names() -> list[str]:
    try:
        folder = data_dir() / "tiresias"
    except ConfigError:  # no shared data at all: the presets are simply not there
        return []
    return sorted(p.stem for p in folder.glob("*.csv") if _TIRESIAS_NAME_RE.fullmatch(p.stem))


def _load_tiresias(name: str) -> Cluster:
    path = data_file("tiresias", f"{name}.csv")
    rows = list(_csv_rows(path, _TIRESIAS_HEADER))
    if len(rows) != 1:
        raise ClusterSpecError("a Tiresias cluster spec has exactly one data row", file=str(path), got=str(len(rows)))
    line, cells = rows[0]
    switches, per_switch, gpus, cpus, mem_gib = (
        _csv_int(path, line, col, cell, minimum=0 if col in ("num_cpu_p_node", "mem_p_node") else 1)
        for col, cell in zip(_TIRESIAS_HEADER, cells, strict=True)
    )
    # Any nNgG.csv dropped in the folder becomes a preset, so its counts are checked like a TOML file's.
    too_big = _size_problem(switches * per_switch, gpus, switches * per_switch * gpus)
    if too_big is not None:
        raise ClusterSpecError(
            f"the spec describes {too_big[0]}, more than corral's limit",
            file=str(path),
            line=line,
            column="num_gpu_p_node" if gpus > MAX_GPUS_PER_NODE else "num_node_p_switch",
            expected=too_big[1],
            got=",".join(cells),
        )
    # A Tiresias "switch" is a top-of-rack switch: num_node_p_switch nodes under each, so one rack per switch.
    nodes = tuple(
        NodeSpec(
            f"s{s}-n{n}",
            DEFAULT_GPU_TYPE.name,
            gpus,
            rack=f"tor-{s}",
            gpus_per_switch=_pcie_switch_size(gpus),
            cpu_milli=cpus * 1000,
            host_mem_mib=mem_gib * _GIB,
        )
        for s in range(switches)
        for n in range(per_switch)
    )
    return Cluster(name, (DEFAULT_GPU_TYPE,), nodes)


# ---------------------------------------------------------------------------------------------------------
# Inline NxG[:TYPE]
# ---------------------------------------------------------------------------------------------------------

INLINE_RACK_SIZE: Final = 32  # nodes per rack in the inline form, as in openb
# ASCII digits only: \d would also take other scripts' digits, which int() reads.
_INLINE_RE: Final = re.compile(r"([0-9]+)[xX]([0-9]+)(?::(.+))?")


def _inline_count(digits: str) -> int:
    """The number ``digits`` writes, clamped to _COUNT_CLAMP: a longer one is over every limit anyway, and int()
    of it would cost time for nothing (Python refuses more than 4,300 digits outright)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 9 else _COUNT_CLAMP


def _inline_cluster(spec: str, num_nodes: int, num_gpus: int, type_name: str | None) -> Cluster:
    gpu_type = DEFAULT_GPU_TYPE
    if type_name is not None:
        found = _builtin_gpu_type(type_name.strip())
        if found is None:
            raise ClusterSpecError(
                f"unknown GPU type in {spec!r}",
                column="TYPE",
                expected=f"one of {', '.join(BUILTIN_GPU_TYPES)}",
                got=type_name,
            )
        gpu_type = found
    if num_nodes < 1 or num_gpus < 1:
        raise ClusterSpecError(
            f"inline cluster {spec!r} needs at least one node and one GPU per node",
            expected="NxG with N >= 1 and G >= 1",
            got=spec,
        )
    too_big = _size_problem(num_nodes, num_gpus, num_nodes * num_gpus)
    if too_big is not None:
        raise ClusterSpecError(
            f"inline cluster {spec!r} has {too_big[0]}, more than corral's limit", expected=too_big[1], got=spec
        )
    nodes = tuple(
        NodeSpec(
            f"node-{i}",
            gpu_type.name,
            num_gpus,
            rack=f"rack-{i // INLINE_RACK_SIZE}",
            gpus_per_switch=_pcie_switch_size(num_gpus),
        )
        for i in range(num_nodes)
    )
    return Cluster(spec, (gpu_type,), nodes)


# ---------------------------------------------------------------------------------------------------------
# TOML files
# ---------------------------------------------------------------------------------------------------------

_TOP_KEYS: Final = ("name", "gpu_type", "nodes", "tenant")
_GPU_TYPE_KEYS: Final = ("name", "mem_mib", "speed")
_NODE_KEYS: Final = (
    "count",
    "prefix",
    "name",
    "gpu_type",
    "gpus",
    "gpus_per_switch",
    "rack",
    "racks_of",
    "cpu_milli",
    "host_mem_mib",
)
_TENANT_KEYS: Final = ("name", "quota_gpus")
_DEFAULT_RACK: Final = "rack-0"  # nodes that name no rack share this one (NodeSpec's default too)


def _toml_type(value: object) -> str:
    """The TOML name of a parsed value's type, for "got" in errors."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__  # dates and times


def _show(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}" (string)'
    if isinstance(value, bool):
        return "true (boolean)" if value else "false (boolean)"
    return f"{value!r} ({_toml_type(value)})"


class _TomlReader:
    """Checks a parsed TOML document against the format and builds the cluster, locating every error."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._lines = text.splitlines()

    # -- locating errors -------------------------------------------------------------------------------

    def _header_lines(self, table: str) -> list[int]:
        """0-based line indexes of each ``[[table]]`` header, in order."""
        pattern = re.compile(rf"^\s*\[\[\s*[\"']?{re.escape(table)}[\"']?\s*\]\]")
        return [i for i, line in enumerate(self._lines) if pattern.match(line)]

    def line_of(self, table: str | None, index: int | None, key: str | None) -> int | None:
        """1-based line of ``key`` in the index-th ``[[table]]`` (or the top level), else of the header.

        A cheap text search, good for hand-written files: inline tables or dotted keys give ``None``.
        """
        if table is None:
            start, end = 0, len(self._lines)
            for i, line in enumerate(self._lines):
                if line.lstrip().startswith("["):
                    end = i
                    break
        else:
            headers = self._header_lines(table)
            if index is None or index >= len(headers):
                return None
            start = headers[index] + 1
            end = next(
                (i for i, line in enumerate(self._lines) if i >= start and line.lstrip().startswith("[")),
                len(self._lines),
            )
        if key is not None:
            pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
            for i in range(start, end):
                if pattern.match(self._lines[i]):
                    return i + 1
        # No such key line: point at the table's header (``start`` is its 0-based index + 1, so 1-based).
        return start if table is not None else None

    def error(
        self,
        message: str,
        *,
        table: str | None,
        index: int | None,
        key: str | None,
        expected: str | None = None,
        got: str | None = None,
    ) -> ClusterSpecError:
        column = key if table is None else f"{table}[{index}]" + (f".{key}" if key is not None else "")
        return ClusterSpecError(
            message,
            file=self.source,
            line=self.line_of(table, index, key),
            column=column,
            expected=expected,
            got=got,
        )

    # -- typed access ----------------------------------------------------------------------------------

    def check_keys(
        self, mapping: Mapping[str, Any], allowed: tuple[str, ...], table: str | None, index: int | None
    ) -> None:
        for key in mapping:
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                message = "unknown key" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                raise self.error(
                    message,
                    table=table,
                    index=index,
                    key=key,
                    expected=f"one of {', '.join(allowed)}",
                    got=key,
                )

    def get_str(
        self, mapping: Mapping[str, Any], key: str, table: str | None, index: int | None, *, required: bool
    ) -> str | None:
        if key not in mapping:
            if required:
                raise self.error(
                    "missing required key", table=table, index=index, key=key, expected="a non-empty string"
                )
            return None
        value = mapping[key]
        if not isinstance(value, str) or not value.strip():
            raise self.error(
                "wrong type",
                table=table,
                index=index,
                key=key,
                expected="a non-empty string",
                got=_show(value),
            )
        return value

    def get_int(
        self,
        mapping: Mapping[str, Any],
        key: str,
        table: str | None,
        index: int | None,
        *,
        minimum: int,
        required: bool,
        default: int | None = None,
        maximum: int | None = None,
        limit: str = "",
    ) -> int | None:
        """An integer in ``[minimum, maximum]``; ``limit`` says in words what the maximum is (for the error)."""
        form = f"an integer >= {minimum}" + ("" if maximum is None else f", at most {maximum:,}{limit}")
        if key not in mapping:
            if required:
                raise self.error("missing required key", table=table, index=index, key=key, expected=form)
            return default
        value = mapping[key]
        # bool is an int in Python but never a count in TOML
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error("wrong type", table=table, index=index, key=key, expected=form, got=_show(value))
        if value < minimum or (maximum is not None and value > maximum):
            raise self.error("out of range", table=table, index=index, key=key, expected=form, got=_show(value))
        return value

    def get_speed(self, mapping: Mapping[str, Any], table: str, index: int) -> float:
        if "speed" not in mapping:
            return 1.0
        value = mapping["speed"]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.error(
                "wrong type", table=table, index=index, key="speed", expected="a number > 0", got=_show(value)
            )
        if not value > 0 or value == float("inf"):
            raise self.error(
                "out of range",
                table=table,
                index=index,
                key="speed",
                expected="a finite number > 0",
                got=_show(value),
            )
        return float(value)

    def tables(self, doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        if key not in doc:
            return []
        value = doc[key]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(
                "wrong type",
                table=None,
                index=None,
                key=key,
                expected=f"an array of tables, each written [[{key}]]",
                got=_show(value),
            )
        return value

    # -- the document ----------------------------------------------------------------------------------

    def cluster(self, doc: Mapping[str, Any], default_name: str) -> Cluster:
        self.check_keys(doc, _TOP_KEYS, None, None)
        name = self.get_str(doc, "name", None, None, required=False) or default_name

        defined: dict[str, GpuType] = {}
        for i, entry in enumerate(self.tables(doc, "gpu_type")):
            self.check_keys(entry, _GPU_TYPE_KEYS, "gpu_type", i)
            type_name = self.get_str(entry, "name", "gpu_type", i, required=True)
            assert type_name is not None
            if type_name in defined:
                raise self.error(
                    "GPU type defined twice",
                    table="gpu_type",
                    index=i,
                    key="name",
                    expected="a name not used by an earlier [[gpu_type]]",
                    got=_show(type_name),
                )
            mem = self.get_int(entry, "mem_mib", "gpu_type", i, minimum=1, required=True)
            assert mem is not None
            defined[type_name] = GpuType(type_name, mem, self.get_speed(entry, "gpu_type", i))

        groups = self.tables(doc, "nodes")
        if not groups:
            raise ClusterSpecError(
                "a cluster needs at least one [[nodes]] table",
                file=self.source,
                column="nodes",
                expected="one or more [[nodes]] tables",
            )
        used: dict[str, GpuType] = {}  # GPU types the nodes use, by the name they use
        nodes: list[NodeSpec] = []
        node_group: dict[str, int] = {}
        num_gpus = 0
        for g, group in enumerate(groups):
            for node in self.node_group(group, g, defined, used, len(nodes), num_gpus):
                if node.name in node_group:
                    raise self.error(
                        f"node name {node.name!r} is already used by nodes[{node_group[node.name]}]",
                        table="nodes",
                        index=g,
                        key="name" if "name" in group else "prefix",
                        expected="node names unique in the cluster",
                        got=_show(node.name),
                    )
                node_group[node.name] = g
                nodes.append(node)
                num_gpus += node.num_gpus

        tenants: list[Tenant] = []
        for i, entry in enumerate(self.tables(doc, "tenant")):
            self.check_keys(entry, _TENANT_KEYS, "tenant", i)
            tenant_name = self.get_str(entry, "name", "tenant", i, required=True)
            assert tenant_name is not None
            if any(t.name == tenant_name for t in tenants):
                raise self.error(
                    "tenant defined twice",
                    table="tenant",
                    index=i,
                    key="name",
                    expected="a name not used by an earlier [[tenant]]",
                    got=_show(tenant_name),
                )
            quota = self.get_int(entry, "quota_gpus", "tenant", i, minimum=0, required=False)
            tenants.append(Tenant(tenant_name, quota))

        # Every defined type, in file order, then the built-in types the nodes used.
        gpu_types = list(defined.values()) + [t for t in used.values() if t.name not in defined]
        try:
            return Cluster(name, tuple(gpu_types), tuple(nodes), tuple(tenants))
        except ClusterSpecError as exc:  # a rule of Cluster we did not check above: still name the file
            raise ClusterSpecError(
                exc.message, file=self.source, column=exc.column, expected=exc.expected, got=exc.got
            ) from exc

    def node_group(
        self,
        group: Mapping[str, Any],
        g: int,
        defined: Mapping[str, GpuType],
        used: dict[str, GpuType],
        first_index: int,
        first_gpus: int,
    ) -> list[NodeSpec]:
        """The nodes of the g-th [[nodes]] group; ``first_index`` nodes with ``first_gpus`` GPUs come before."""
        t = "nodes"
        self.check_keys(group, _NODE_KEYS, t, g)
        nodes_limit = " (corral's limit on nodes in a cluster)"
        gpus_limit = " (corral's limit on GPUs per node)"
        count = self.get_int(
            group, "count", t, g, minimum=1, required=False, default=1, maximum=MAX_NODES, limit=nodes_limit
        )
        type_name = self.get_str(group, "gpu_type", t, g, required=True)
        gpus = self.get_int(group, "gpus", t, g, minimum=1, required=True, maximum=MAX_GPUS_PER_NODE, limit=gpus_limit)
        per_switch = self.get_int(
            group, "gpus_per_switch", t, g, minimum=1, required=False, maximum=MAX_GPUS_PER_NODE, limit=gpus_limit
        )
        prefix = self.get_str(group, "prefix", t, g, required=False)
        name = self.get_str(group, "name", t, g, required=False)
        rack = self.get_str(group, "rack", t, g, required=False)
        racks_of = self.get_int(group, "racks_of", t, g, minimum=1, required=False, maximum=MAX_NODES)
        cpu_milli = self.get_int(group, "cpu_milli", t, g, minimum=0, required=False)
        host_mem = self.get_int(group, "host_mem_mib", t, g, minimum=0, required=False)
        assert count is not None and type_name is not None and gpus is not None
        # Totals are checked before a single node is built: the groups so far plus this one.
        too_big = _size_problem(first_index + count, gpus, first_gpus + count * gpus)
        if too_big is not None:
            raise self.error(
                f"with nodes[{g}] the cluster would have {too_big[0]}, more than corral's limit",
                table=t,
                index=g,
                key="count" if "count" in group else "gpus",
                expected=too_big[1],
                got=f"{count:,} nodes of {gpus:,} GPUs"
                + (f", after {first_index:,} nodes with {first_gpus:,} GPUs in earlier groups" if first_index else ""),
            )

        if name is not None and prefix is not None:
            raise self.error(
                "give either name or prefix, not both",
                table=t,
                index=g,
                key="name",
                expected="name (one node) or prefix (a group)",
                got=_show(name),
            )
        if name is not None and count != 1:
            raise self.error(
                "name is for a single node; a group of nodes needs a prefix",
                table=t,
                index=g,
                key="name",
                expected="prefix when count > 1",
                got=_show(name),
            )
        if rack is not None and racks_of is not None:
            raise self.error(
                "give either rack or racks_of, not both",
                table=t,
                index=g,
                key="racks_of",
                expected="rack (one rack) or racks_of (new racks of N nodes)",
                got=_show(racks_of),
            )

        gpu_type = defined.get(type_name) or used.get(type_name) or _builtin_gpu_type(type_name)
        if gpu_type is None:
            known = [*defined, *(n for n in BUILTIN_GPU_TYPES if n not in defined)]
            raise self.error(
                "unknown GPU type",
                table=t,
                index=g,
                key="gpu_type",
                expected=f"a [[gpu_type]] name or a built-in type: one of {', '.join(known)}",
                got=_show(type_name),
            )
        used.setdefault(type_name, gpu_type)

        def node_name(i: int) -> str:
            if name is not None:
                return name
            if prefix is not None:
                return f"{prefix}{i}"
            return f"node-{first_index + i}"  # numbered across the whole cluster, so groups never collide

        def rack_of(i: int) -> str:
            if rack is not None:
                return rack
            if racks_of is not None:
                label = prefix if prefix is not None else f"nodes{g}-"
                return f"{label}rack-{i // racks_of}"
            return _DEFAULT_RACK

        return [
            NodeSpec(
                node_name(i),
                gpu_type.name,
                gpus,
                rack=rack_of(i),
                gpus_per_switch=per_switch,
                cpu_milli=cpu_milli,
                host_mem_mib=host_mem,
            )
            for i in range(count)
        ]


def parse_cluster_toml(text: str, *, source: str = "<string>") -> Cluster:
    """A cluster from the text of a TOML cluster file (format: docs/clusters.md).

    ``source`` names the file in errors. The cluster's name is the ``name`` key, else the file's stem.
    """
    try:
        doc = parse_toml(text, file=source)
    except TomlError as exc:
        raise ClusterSpecError(
            f"TOML syntax error: {exc.syntax}" if exc.syntax is not None else exc.message,
            file=source,
            line=exc.line,
            column=exc.column,
            expected=exc.expected,
            got=exc.got,
        ) from None
    default_name = Path(source).stem if source != "<string>" else "cluster"
    return _TomlReader(text, source).cluster(doc, default_name)


def load_cluster_file(path: str | Path) -> Cluster:
    """A cluster from a TOML file (format: docs/clusters.md)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ClusterSpecError("no such cluster file", file=str(p)) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise ClusterSpecError(f"cannot read the cluster file: {exc}", file=str(p)) from exc
    try:
        text = decode_toml(raw, file=str(p), what="cluster file")
    except TomlError as exc:
        raise ClusterSpecError(exc.message, file=exc.file, line=exc.line, expected=exc.expected, got=exc.got) from None
    return parse_cluster_toml(text, source=str(p))


# ---------------------------------------------------------------------------------------------------------
# The front door
# ---------------------------------------------------------------------------------------------------------

PRESETS: Final[Mapping[str, Callable[[], Cluster]]] = MappingProxyType(
    {"philly": _load_philly, "philly-revised": _load_philly_revised, "openb": _load_openb}
)


def preset_names() -> list[str]:
    """Every preset name :func:`load_cluster` accepts here (the Tiresias ones are the files that exist)."""
    return [*PRESETS, *_tiresias_names()]


def _accepted_forms() -> str:
    return (
        f"a preset ({', '.join(preset_names())}), NxG (N nodes of G GPUs, e.g. 4x8), "
        f"NxG:TYPE with TYPE one of {', '.join(BUILTIN_GPU_TYPES)}, or a path to a .toml cluster file"
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte: no file
        return False


def load_cluster(spec: str) -> Cluster:
    """The cluster ``spec`` names: a preset, ``NxG``, ``NxG:TYPE``, or a path to a TOML file.

    Presets and the inline form win over a file of the same name in the current directory; write ``./name``
    to mean the file.
    """
    text = spec.strip()
    key = text.lower()
    if key in PRESETS:
        return PRESETS[key]()
    if _TIRESIAS_NAME_RE.fullmatch(key):
        if (data_dir() / "tiresias" / f"{key}.csv").is_file():
            return _load_tiresias(key)
        raise ClusterSpecError(f"no Tiresias cluster spec named {text!r}", expected=_accepted_forms(), got=text)
    inline = _INLINE_RE.fullmatch(text)
    if inline is not None:
        return _inline_cluster(text, _inline_count(inline.group(1)), _inline_count(inline.group(2)), inline.group(3))
    path = Path(text)
    if path.suffix.lower() == ".toml" or _is_file(path) or "/" in text or "\\" in text:
        return load_cluster_file(path)
    raise ClusterSpecError(f"unknown cluster {text!r}", expected=_accepted_forms(), got=text)


def describe_cluster(cluster: Cluster) -> list[tuple[str, str]]:
    """(label, value) rows summarising a cluster, for the CLI to print as a table."""
    gpus_by_type: Counter[str] = Counter()
    nodes_by_type: Counter[str] = Counter()
    shapes: Counter[tuple[int, str]] = Counter()
    racks: dict[str, None] = {}
    for node in cluster.nodes:
        gpus_by_type[node.gpu_type] += node.num_gpus
        nodes_by_type[node.gpu_type] += 1
        shapes[(node.num_gpus, node.gpu_type)] += 1
        racks[node.rack] = None
    rows = [
        ("name", cluster.name),
        ("nodes", f"{len(cluster.nodes):,}"),
        ("GPUs", f"{cluster.num_gpus:,}"),
    ]
    for t in cluster.gpu_types:
        rows.append(
            (
                f"GPU type {t.name}",
                f"{plural(gpus_by_type[t.name], 'GPU')} on {plural(nodes_by_type[t.name], 'node')}; "
                f"{t.mem_mib:,} MiB; speed {t.speed:g}",
            )
        )
    rows.append(
        (
            "node shapes",
            ", ".join(
                f"{plural(n, 'node')} of {g} x {t}"
                for (g, t), n in sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0]))
            ),
        )
    )
    rows.append(("racks", f"{len(racks):,}"))
    if not cluster.tenants:
        rows.append(("tenants", "none"))
    else:
        shown = [
            t.name if t.quota_gpus is None else f"{t.name} ({plural(t.quota_gpus, 'GPU')})" for t in cluster.tenants
        ]
        if len(shown) > 12:
            shown = [*shown[:12], f"and {len(shown) - 12:,} more"]
        quotas = [t.quota_gpus for t in cluster.tenants if t.quota_gpus is not None]
        total = f"; quotas total {plural(sum(quotas), 'GPU')}" if quotas else "; no quotas"
        rows.append(("tenants", f"{len(cluster.tenants):,}{total}: {', '.join(shown)}"))
    return rows


# ---------------------------------------------------------------------------------------------------------
# Quotas for an experiment: AntMan's guaranteed jobs run within their tenant's quota (OSDI'20 §4), so a replay
# of a trace with tenants needs a quota per tenant. The presets carry none; these forms add them.
# ---------------------------------------------------------------------------------------------------------

QUOTA_FORMS: Final = (
    "philly-vc (the Philly VCs' quotas, scaled to the cluster), equal or equal:F (F in (0, 1]: the cluster's "
    "GPUs x F split equally among the trace's tenants), NAME=GPUS[,NAME=GPUS...] (explicit), or none"
)


def _quota_error(message: str, spec: str) -> ConfigError:
    return ConfigError(f"--quotas {spec!r}: {message}; expected {QUOTA_FORMS}")


def _philly_vc_quotas(cluster: Cluster, spec: str) -> list[Tenant]:
    """The VCs of philly_vc.csv, quota ``node num x 8``, scaled down when they add up to more than the cluster.

    Scaling is ``floor(q x G / S)`` for each quota ``q``, with ``G`` the cluster's GPUs and ``S`` the quotas'
    sum (2,816): proportional, and the floors keep the sum at most ``G`` (on ``philly``, 2,490 GPUs, the sum
    becomes 2,485). A quota is a promise, so promising more GPUs than exist would let the quota check admit
    guaranteed jobs that cannot all run, which is not what AntMan's guarantee means.
    """
    raw = philly_vc_tenants()
    total = sum(t.quota_gpus or 0 for t in raw)
    gpus = cluster.num_gpus
    if total <= gpus:
        return list(raw)
    scaled = [Tenant(t.name, (t.quota_gpus or 0) * gpus // total) for t in raw]
    empty = [t.name for t in scaled if t.quota_gpus == 0]
    if empty:
        raise _quota_error(
            f"the cluster's {gpus:,} GPUs are too few for the Philly VC quotas: scaled by {gpus:,}/{total:,},"
            f" {', '.join(empty)} would get 0 GPUs",
            spec,
        )
    return scaled


def _equal_quotas(cluster: Cluster, spec: str, fraction_text: str | None, tenants: list[str]) -> list[Tenant]:
    """``floor(G x F / n)`` GPUs for each of the ``n`` trace tenants (``G`` the cluster's GPUs)."""
    fraction = Fraction(1)
    if fraction_text is not None:
        try:
            # Fraction, not float: 0.29 x 100 GPUs must floor to 29, and in binary floating point it is 28.99...
            fraction = Fraction(fraction_text.strip())
        except (ValueError, ZeroDivisionError):
            raise _quota_error(f"F must be a number in (0, 1], got {fraction_text!r}", spec) from None
    if not 0 < fraction <= 1:
        raise _quota_error(f"F must be in (0, 1], got {fraction_text!r}", spec)
    if not tenants:
        return []
    each = math.floor(cluster.num_gpus * fraction / len(tenants))
    if each == 0:
        raise _quota_error(
            f"{cluster.num_gpus:,} GPUs x {float(fraction):g} split among {len(tenants):,} tenants gives each 0 GPUs",
            spec,
        )
    return [Tenant(name, each) for name in tenants]


def _explicit_quotas(spec: str) -> list[Tenant]:
    out: dict[str, Tenant] = {}
    for item in spec.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise _quota_error(f"{item.strip()!r} is not NAME=GPUS", spec)
        if name in out:
            raise _quota_error(f"tenant {name!r} is given twice", spec)
        try:
            gpus = int(value)
        except ValueError:
            gpus = -1
        if gpus < 0:
            raise _quota_error(f"the quota of {name!r} must be an integer >= 0, got {value!r}", spec)
        out[name] = Tenant(name, gpus)
    return list(out.values())


def with_quotas(cluster: Cluster, spec: str, tenants_in_trace: Sequence[str]) -> Cluster:
    """``cluster`` with the tenants and GPU quotas that ``spec`` names (forms: :data:`QUOTA_FORMS`).

    - ``philly-vc``: the 11 virtual clusters of philly/philly_vc.csv, each with ``node num x 8`` GPUs, scaled
      down proportionally when they add up to more than the cluster's ``G`` GPUs: ``floor(q x G / 2816)``,
      so they sum to at most ``G`` (2,485 on ``philly``); :func:`philly_vc_tenants` gives the unscaled ones;
    - ``equal`` or ``equal:F``: ``floor(G x F / n)`` GPUs for each of the ``n`` tenants of the trace
      (``F`` defaults to 1, must be in (0, 1]; a share that floors to 0 GPUs is an error);
    - ``NAME=GPUS,NAME=GPUS,...``: those tenants with those quotas (integers >= 0; they may add up to more
      than the cluster, as in a TOML file);
    - ``none``: ``cluster`` as it is, with its own tenants and quotas if any.

    Except for ``none``, the result's tenants replace the cluster's: the spec's, then every tenant of
    ``tenants_in_trace`` the spec gives no quota, without one (so no promise and no cap for their jobs).
    :func:`describe_quotas` says in words what was done. A bad spec raises ConfigError naming the forms.
    """
    text = spec.strip()
    key = text.lower()
    trace_tenants = sorted(set(tenants_in_trace))
    if key == "none":
        return cluster
    if key == "philly-vc":
        quotas = _philly_vc_quotas(cluster, text)
    elif key == "equal" or key.startswith("equal:"):
        quotas = _equal_quotas(cluster, text, text.partition(":")[2] if ":" in text else None, trace_tenants)
    elif "=" in text:
        quotas = _explicit_quotas(text)
    else:
        raise _quota_error("unknown form", text)
    named = {t.name for t in quotas}
    return cluster.with_tenants([*quotas, *(Tenant(name) for name in trace_tenants if name not in named)])


def describe_quotas(cluster: Cluster, spec: str, tenants_in_trace: Sequence[str]) -> str:
    """One sentence on the quotas of ``cluster`` (what :func:`with_quotas` returned for ``spec``) as a replay of
    a trace with ``tenants_in_trace`` sees them: each quota, their total against the cluster's GPUs, the trace
    tenants with no quota and the quota tenants absent from the trace. For a trace's notes."""
    present = set(tenants_in_trace)
    quotas = [t for t in cluster.tenants if t.quota_gpus is not None]
    text = spec.strip()
    if text.lower() == "philly-vc":
        raw = sum(t.quota_gpus or 0 for t in philly_vc_tenants())
        how = "philly-vc (node num x 8"  # as philly_vc_tenants() computes them
        how += f", scaled by {cluster.num_gpus:,}/{raw:,} and floored)" if raw > cluster.num_gpus else ")"
    else:
        how = text
    if not quotas:
        return f"quotas {how}: none (no tenant of the cluster has a quota)"
    total = sum(t.quota_gpus or 0 for t in quotas)
    shown = [f"{t.name} {t.quota_gpus:,}" for t in quotas]
    if len(shown) > 20:
        shown = [*shown[:20], f"and {len(shown) - 20:,} more"]
    note = (
        f"quotas {how}: {total:,} of {plural(cluster.num_gpus, 'GPU')} promised to {plural(len(quotas), 'tenant')}:"
        f" {', '.join(shown)}"
    )
    with_quota = {t.name for t in quotas}
    without = sorted(present - with_quota)
    if without:
        note += f"; trace tenants without a quota: {', '.join(without)}"
    absent = [t.name for t in quotas if t.name not in present]
    if absent:
        note += f"; quota tenants with no job in the trace: {', '.join(absent)}"
    return note
