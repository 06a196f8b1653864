"""Cluster specs: presets on the real machine lists, the inline NxG form, TOML files and their errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from corral.core.cluster import Cluster, Topology, TopologyLevel
from corral.core.errors import ClusterSpecError, ConfigError
from corral.core.wording import plural
from corral.sim.clusters import (
    BUILTIN_GPU_TYPES,
    describe_cluster,
    describe_quotas,
    load_cluster,
    load_cluster_file,
    parse_cluster_toml,
    philly_vc_tenants,
    preset_names,
    with_quotas,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "small-hetero.toml"


def gpus_by_type(cluster: Cluster) -> dict[str, int]:
    out: Counter[str] = Counter()
    for node in cluster.nodes:
        out[node.gpu_type] += node.num_gpus
    return dict(out)


def racks(cluster: Cluster) -> set[str]:
    return {node.rack for node in cluster.nodes}


# --------------------------------------------------------------------------------------------------------
# Presets, on the real files
# --------------------------------------------------------------------------------------------------------


def test_preset_names_cover_every_shipped_spec() -> None:
    names = preset_names()
    for name in ("philly", "philly-revised", "openb", "n32g4", "n1g4", "n160g8", "n256g8", "cluster_spec"):
        assert name in names


def test_philly() -> None:
    c = load_cluster("philly")
    assert c.name == "philly"
    assert len(c.nodes) == 552
    assert c.num_gpus == 2490
    assert gpus_by_type(c) == {"12GB": 321 * 2, "24GB": 231 * 8}
    assert {t.name: (t.mem_mib, t.speed) for t in c.gpu_types} == {"12GB": (12288, 1.0), "24GB": (24576, 1.0)}
    shapes = Counter((n.num_gpus, n.gpu_type, n.gpus_per_switch) for n in c.nodes)
    assert shapes == {(2, "12GB", None): 321, (8, "24GB", 4): 231}
    # racks of 16 machines of one kind: ceil(321/16) + ceil(231/16)
    assert len(racks(c)) == 21 + 15
    assert all(Counter(n.rack for n in c.nodes)[r] <= 16 for r in racks(c))
    assert all(len({n.gpu_type for n in c.nodes if n.rack == r}) == 1 for r in racks(c))
    # the 11 VCs of philly_vc.csv, without quotas
    assert len(c.tenants) == 11
    assert all(t.quota_gpus is None for t in c.tenants)
    assert c.tenants[0].name == "6214e9"
    assert c.nodes[0].name == "m0"


def test_philly_vc_tenants_overcommit_philly() -> None:
    tenants = philly_vc_tenants()
    assert len(tenants) == 11
    assert {t.name: t.quota_gpus for t in tenants}["6214e9"] == 64 * 8
    total = sum(t.quota_gpus or 0 for t in tenants)
    assert total == 352 * 8 == 2816
    assert total > load_cluster("philly").num_gpus  # by 326 GPUs: documented in docs/clusters.md
    assert total < load_cluster("philly-revised").num_gpus
    assert [t.name for t in tenants] == [t.name for t in load_cluster("philly").tenants]


def test_philly_revised() -> None:
    c = load_cluster("philly-revised")
    assert c.num_gpus == 3205
    assert len(c.nodes) == 552 - 13  # the 13 machines with 0 GPUs are left out
    assert Counter(n.num_gpus for n in c.nodes) == {4: 271, 8: 264, 2: 3, 3: 1}
    # memory joined from the original list by machineId
    assert gpus_by_type(c) == {"12GB": 2235, "24GB": 970}
    assert {n.name: n.gpu_type for n in c.nodes}["m0"] == "12GB"
    assert len(c.tenants) == 11


def test_openb() -> None:
    c = load_cluster("openb")
    assert len(c.nodes) == 1213
    assert c.num_gpus == 6212
    assert gpus_by_type(c) == {
        "G2": 4392,
        "T4": 842,
        "G3": 312,
        "P100": 265,
        "V100M32": 204,
        "V100M16": 195,
        "A10": 2,
    }
    mem = {t.name: t.mem_mib for t in c.gpu_types}
    assert mem == {
        "P100": 16384,
        "T4": 16384,
        "V100M16": 16384,
        "V100M32": 32768,
        "A10": 24576,
        "G2": 16384,
        "G3": 16384,
    }
    assert all(t.speed == 1.0 for t in c.gpu_types)
    first = c.nodes[0]
    assert (first.name, first.gpu_type, first.num_gpus) == ("openb-node-0000", "P100", 2)
    assert (first.cpu_milli, first.host_mem_mib) == (64000, 262144)
    assert all(n.num_gpus > 0 for n in c.nodes)
    assert len(racks(c)) == 38  # ceil(1213 / 32)
    assert c.tenants == ()


@pytest.mark.parametrize(
    ("name", "nodes", "gpus", "num_racks", "cpu_milli", "host_mem_mib"),
    [
        ("n32g4", 32, 128, 1, 40_000, 256 * 1024),
        ("n1g4", 1, 4, 1, 40_000, 256 * 1024),
        ("n160g8", 160, 1280, 5, 128_000, 256 * 1024),
        ("n256g8", 256, 2048, 8, 64_000, 256 * 1024),
        ("cluster_spec", 16, 64, 1, 128_000, 254 * 1024),
    ],
)
def test_tiresias(name: str, nodes: int, gpus: int, num_racks: int, cpu_milli: int, host_mem_mib: int) -> None:
    c = load_cluster(name)
    assert c.name == name
    assert len(c.nodes) == nodes
    assert c.num_gpus == gpus
    assert len(racks(c)) == num_racks
    assert [t.name for t in c.gpu_types] == ["gpu"]
    assert (c.gpu_types[0].mem_mib, c.gpu_types[0].speed) == (16384, 1.0)
    assert {(n.cpu_milli, n.host_mem_mib) for n in c.nodes} == {(cpu_milli, host_mem_mib)}


def test_presets_are_case_insensitive() -> None:
    assert load_cluster(" Philly ").num_gpus == 2490
    assert load_cluster("N32G4").num_gpus == 128


def test_tiresias_name_without_a_file() -> None:
    with pytest.raises(ClusterSpecError, match="n64g8") as info:
        load_cluster("n64g8")
    assert "NxG" in (info.value.expected or "")


# --------------------------------------------------------------------------------------------------------
# Topology of every preset
# --------------------------------------------------------------------------------------------------------

ALL_PRESETS = ["philly", "philly-revised", "openb", "n32g4", "n1g4", "n160g8", "n256g8", "cluster_spec"]


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_preset_topology(name: str) -> None:
    c = load_cluster(name)
    topo = Topology(c)
    assert topo.num_gpus == c.num_gpus
    assert topo.num_nodes == len(c.nodes)
    assert sum(topo.type_num_gpus) == c.num_gpus
    assert len(topo.rack_names) == len(racks(c))

    # Inside one node: a node of more than 4 GPUs has PCIe switches of 4; a smaller one has one switch.
    for n, node in enumerate(c.nodes):
        gpus = list(topo.node_gpus(n))
        if node.num_gpus > 4:
            assert topo.level(gpus[:4]) is TopologyLevel.SWITCH
            assert topo.level([gpus[0], gpus[4]]) is TopologyLevel.NODE
        elif node.num_gpus > 1:
            assert topo.level(gpus) is TopologyLevel.SWITCH
        assert topo.level(gpus[:1]) is TopologyLevel.GPU

    # Two nodes: the same rack, then different racks.
    by_rack: dict[int, list[int]] = {}
    for n in range(topo.num_nodes):
        by_rack.setdefault(topo.node_rack[n], []).append(n)
    pair = next((ns[:2] for ns in by_rack.values() if len(ns) >= 2), None)
    if pair is not None:
        a, b = pair
        assert topo.level([topo.node_first_gpu[a], topo.node_first_gpu[b]]) is TopologyLevel.RACK
    if len(by_rack) > 1:
        (ra, na), (rb, nb) = list(by_rack.items())[:2]
        assert ra != rb
        assert topo.level([topo.node_first_gpu[na[0]], topo.node_first_gpu[nb[0]]]) is TopologyLevel.CLUSTER


def test_philly_topology_by_name() -> None:
    c = load_cluster("philly")
    topo = Topology(c)
    index = {name: i for i, name in enumerate(topo.node_names)}
    first_8gpu = next(i for i, n in enumerate(c.nodes) if n.num_gpus == 8)
    g8 = list(topo.node_gpus(first_8gpu))
    assert topo.level(g8[4:]) is TopologyLevel.SWITCH
    assert topo.level(g8) is TopologyLevel.NODE
    # the first 16 machines of the file (all 2-GPU) share a rack; the 17th starts a new one
    m0 = list(topo.node_gpus(index["m0"]))
    assert topo.level(m0) is TopologyLevel.SWITCH
    assert topo.level([m0[0], topo.node_first_gpu[15]]) is TopologyLevel.RACK
    assert topo.level([m0[0], topo.node_first_gpu[16]]) is TopologyLevel.CLUSTER


# --------------------------------------------------------------------------------------------------------
# Inline NxG[:TYPE]
# --------------------------------------------------------------------------------------------------------


def test_inline_nxg() -> None:
    c = load_cluster("4x8")
    assert c.name == "4x8"
    assert (len(c.nodes), c.num_gpus) == (4, 32)
    assert [t.name for t in c.gpu_types] == ["gpu"]
    assert [n.name for n in c.nodes] == ["node-0", "node-1", "node-2", "node-3"]
    assert racks(c) == {"rack-0"}
    topo = Topology(c)
    assert topo.level([0, 1, 2, 3]) is TopologyLevel.SWITCH
    assert topo.level([0, 7]) is TopologyLevel.NODE
    assert topo.level([0, 8]) is TopologyLevel.RACK


def test_inline_racks_of_32() -> None:
    c = load_cluster("65x1")
    assert len(racks(c)) == 3
    topo = Topology(c)
    assert topo.level([0, 31]) is TopologyLevel.RACK
    assert topo.level([0, 32]) is TopologyLevel.CLUSTER


@pytest.mark.parametrize(
    ("spec", "type_name", "mem_mib", "speed"),
    [
        ("2x4:A100-80GB", "A100-80GB", 81920, 2.0),
        ("2x4:v100-32gb", "V100-32GB", 32768, 1.0),
        ("1X2:K80", "K80", 12288, 0.25),
        ("3x8:H100-80GB", "H100-80GB", 81920, 4.0),
    ],
)
def test_inline_typed(spec: str, type_name: str, mem_mib: int, speed: float) -> None:
    c = load_cluster(spec)
    assert [(t.name, t.mem_mib, t.speed) for t in c.gpu_types] == [(type_name, mem_mib, speed)]
    assert {n.gpu_type for n in c.nodes} == {type_name}


def test_builtin_table_has_the_common_gpus() -> None:
    for name in ("V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "P100", "T4", "K80"):
        assert BUILTIN_GPU_TYPES[name].mem_mib > 0


@pytest.mark.parametrize("spec", ["0x8", "4x0"])
def test_inline_zero(spec: str) -> None:
    with pytest.raises(ClusterSpecError, match="at least one node"):
        load_cluster(spec)


def test_inline_unknown_type() -> None:
    with pytest.raises(ClusterSpecError) as info:
        load_cluster("4x8:B200")
    assert info.value.column == "TYPE"
    assert info.value.got == "B200"
    assert "A100-80GB" in (info.value.expected or "")


@pytest.mark.parametrize("spec", ["bogus", "4x", "x8", "philly2", ""])
def test_unknown_form(spec: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(spec)
    expected = info.value.expected or ""
    for form in ("philly", "openb", "n32g4", "NxG", "NxG:TYPE", ".toml"):
        assert form in expected


# --------------------------------------------------------------------------------------------------------
# TOML files
# --------------------------------------------------------------------------------------------------------


def test_example_file() -> None:
    for c in (load_cluster(str(EXAMPLE)), load_cluster_file(EXAMPLE)):
        assert c.name == "small-hetero"
        assert [(t.name, t.mem_mib, t.speed) for t in c.gpu_types] == [
            ("V100", 16384, 1.0),
            ("A100", 81920, 2.0),
        ]
        assert gpus_by_type(c) == {"V100": 34, "A100": 10}
        assert [n.name for n in c.nodes] == [
            "v100-0",
            "v100-1",
            "v100-2",
            "v100-3",
            "a100-0",
            "a100-1",
            "ws-big",
            "ws-0",
        ]
        assert [n.rack for n in c.nodes[:4]] == ["v100-rack-0", "v100-rack-0", "v100-rack-1", "v100-rack-1"]
        assert racks(c) == {"v100-rack-0", "v100-rack-1", "r-a100"}
        assert (c.nodes[0].cpu_milli, c.nodes[0].host_mem_mib, c.nodes[0].gpus_per_switch) == (
            64000,
            262144,
            4,
        )
        assert [(t.name, t.quota_gpus) for t in c.tenants] == [("vision", 24), ("nlp", 16), ("interns", None)]
    topo = Topology(load_cluster_file(EXAMPLE))
    v0, v1, v2 = (list(topo.node_gpus(i)) for i in range(3))
    assert topo.level(v0[:4]) is TopologyLevel.SWITCH
    assert topo.level(v0[3:5]) is TopologyLevel.NODE
    assert topo.level([v0[0], v1[0]]) is TopologyLevel.RACK
    assert topo.level([v0[0], v2[0]]) is TopologyLevel.CLUSTER


MINIMAL = """\
[[nodes]]
count = 2
gpu_type = "A100-80GB"
gpus = 4
"""


def test_minimal_file_defaults() -> None:
    c = parse_cluster_toml(MINIMAL)
    assert c.name == "cluster"
    # a built-in type may be used without a [[gpu_type]]
    assert [(t.name, t.mem_mib) for t in c.gpu_types] == [("A100-80GB", 81920)]
    assert [(n.name, n.rack, n.gpus_per_switch) for n in c.nodes] == [
        ("node-0", "rack-0", None),
        ("node-1", "rack-0", None),
    ]
    assert c.tenants == ()


def test_default_names_are_numbered_across_groups(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(MINIMAL + MINIMAL)
    c = load_cluster(str(path))
    assert c.name == "two"  # the file's stem
    assert [n.name for n in c.nodes] == ["node-0", "node-1", "node-2", "node-3"]


def test_file_type_overrides_builtin() -> None:
    text = '[[gpu_type]]\nname = "T4"\nmem_mib = 15360\nspeed = 0.5\n' + MINIMAL.replace("A100-80GB", "T4")
    c = parse_cluster_toml(text)
    assert [(t.name, t.mem_mib, t.speed) for t in c.gpu_types] == [("T4", 15360, 0.5)]


GOOD = """\
name = "lab"

[[gpu_type]]
name = "V100"
mem_mib = 16384

[[nodes]]
count = 2
prefix = "a-"
gpu_type = "V100"
gpus = 8

[[nodes]]
count = 2
prefix = "b-"
gpu_type = "V100"
gpus = 4

[[tenant]]
name = "vision"
quota_gpus = 16
"""


def test_good_file_parses() -> None:
    c = parse_cluster_toml(GOOD)
    assert (c.name, c.num_gpus, len(c.tenants)) == ("lab", 24, 1)


# Each case: a change to GOOD (old -> new), then the key path, a piece of `expected`, the 1-based line, `got`.
BROKEN = [
    pytest.param(("gpus = 4", "gpus = 4\ngpu = 4"), "nodes[1].gpu", "one of count", 18, "gpu", id="unknown-key"),
    pytest.param(('name = "lab"', 'nam = "lab"'), "nam", "one of name", 1, "nam", id="unknown-top-key"),
    pytest.param(("gpus = 4\n", ""), "nodes[1].gpus", "an integer >= 1", 13, None, id="missing-key"),
    pytest.param(("mem_mib = 16384\n", ""), "gpu_type[0].mem_mib", "an integer >= 1", 3, None, id="missing-mem"),
    pytest.param(
        ("gpus = 8", 'gpus = "eight"'),
        "nodes[0].gpus",
        "an integer >= 1",
        11,
        '"eight" (string)',
        id="wrong-type",
    ),
    pytest.param(("gpus = 8", "gpus = 8.0"), "nodes[0].gpus", "an integer", 11, "8.0 (float)", id="float-count"),
    pytest.param(("gpus = 8", "gpus = true"), "nodes[0].gpus", "an integer", 11, "true (boolean)", id="bool-count"),
    pytest.param(('name = "lab"', "name = 3"), "name", "a non-empty string", 1, "3 (integer)", id="wrong-name"),
    pytest.param(
        ('gpu_type = "V100"\ngpus = 4', 'gpu_type = "V200"\ngpus = 4'),
        "nodes[1].gpu_type",
        "V100",
        16,
        '"V200" (string)',
        id="unknown-gpu-type",
    ),
    pytest.param(
        ('count = 2\nprefix = "b-"', 'count = 0\nprefix = "b-"'),
        "nodes[1].count",
        "an integer >= 1",
        14,
        "0 (integer)",
        id="zero-count",
    ),
    pytest.param(("gpus = 8", "gpus = 0"), "nodes[0].gpus", "an integer >= 1", 11, "0 (integer)", id="zero-gpus"),
    pytest.param(("gpus = 8", "gpus = -8"), "nodes[0].gpus", "an integer >= 1", 11, "-8 (integer)", id="negative-gpus"),
    pytest.param(
        ("mem_mib = 16384", "mem_mib = 0"),
        "gpu_type[0].mem_mib",
        "an integer >= 1",
        5,
        "0 (integer)",
        id="zero-mem",
    ),
    pytest.param(
        ("mem_mib = 16384", "mem_mib = 16384\nspeed = 0"),
        "gpu_type[0].speed",
        "> 0",
        6,
        "0 (integer)",
        id="zero-speed",
    ),
    pytest.param(
        ("quota_gpus = 16", "quota_gpus = -1"),
        "tenant[0].quota_gpus",
        "an integer >= 0",
        21,
        "-1 (integer)",
        id="negative-quota",
    ),
    pytest.param(
        ("gpus = 8", "gpus = 8\ngpus_per_switch = 0"),
        "nodes[0].gpus_per_switch",
        ">= 1",
        12,
        "0 (integer)",
        id="zero-switch",
    ),
    pytest.param(
        ("gpus = 8", "gpus = 8\nracks_of = 0"),
        "nodes[0].racks_of",
        ">= 1",
        12,
        "0 (integer)",
        id="zero-racks-of",
    ),
    pytest.param(
        ('prefix = "a-"', 'name = "a"'),
        "nodes[0].name",
        "prefix when count > 1",
        9,
        '"a" (string)',
        id="name-with-count",
    ),
    pytest.param(
        ('prefix = "a-"', 'prefix = "a-"\nname = "a"'),
        "nodes[0].name",
        "name (one node) or prefix",
        10,
        '"a" (string)',
        id="name-and-prefix",
    ),
    pytest.param(
        ("gpus = 8", 'gpus = 8\nrack = "r"\nracks_of = 2'),
        "nodes[0].racks_of",
        "rack (one rack)",
        13,
        "2 (integer)",
        id="rack-and-racks-of",
    ),
    pytest.param(
        ('prefix = "b-"', 'prefix = "a-"'),
        "nodes[1].prefix",
        "unique",
        15,
        '"a-0" (string)',
        id="duplicate-node",
    ),
    pytest.param(
        (
            '[[nodes]]\ncount = 2\nprefix = "a-"',
            '[[gpu_type]]\nname = "V100"\nmem_mib = 1\n\n[[nodes]]\ncount = 2\nprefix = "a-"',
        ),
        "gpu_type[1].name",
        "not used",
        8,
        '"V100" (string)',
        id="duplicate-type",
    ),
    pytest.param(
        ('[[tenant]]\nname = "vision"', '[[tenant]]\nname = "vision"\n[[tenant]]\nname = "vision"'),
        "tenant[1].name",
        "not used",
        22,
        '"vision" (string)',
        id="duplicate-tenant",
    ),
    pytest.param(
        ('gpu_type = "V100"\ngpus = 8', "gpus = 8"),
        "nodes[0].gpu_type",
        "a non-empty string",
        7,
        None,
        id="missing-gpu-type",
    ),
]


@pytest.mark.parametrize(("change", "column", "expected", "line", "got"), BROKEN)
def test_broken_file(
    tmp_path: Path, change: tuple[str, str], column: str, expected: str, line: int, got: str | None
) -> None:
    old, new = change
    assert old in GOOD
    path = tmp_path / "lab.toml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(str(path))
    err = info.value
    assert err.file == str(path)
    assert err.column == column
    assert expected in (err.expected or "")
    assert err.line == line
    assert err.got == got
    # the rendered message carries all of it
    assert str(path) in str(err) and column in str(err)


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ClusterSpecError, match="did you mean 'gpus'"):
        parse_cluster_toml(GOOD.replace("gpus = 8", "gpu = 8"), source="lab.toml")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace("gpus = 4", "gpus = = 4"))
    with pytest.raises(ClusterSpecError) as info:
        load_cluster_file(path)
    assert info.value.file == str(path)
    assert info.value.line == 17
    assert "TOML syntax error" in str(info.value)
    assert "line 17" in str(info.value)  # tomllib's own message, passed on


@pytest.mark.parametrize(
    ("text", "column", "expected"),
    [
        ('name = "x"\n', "nodes", "one or more [[nodes]] tables"),
        ('[nodes]\ngpu_type = "T4"\ngpus = 1\n', "nodes", "array of tables"),
        ("nodes = 3\n", "nodes", "array of tables"),
        ("tenant = [1, 2]\n" + MINIMAL, "tenant", "array of tables"),
    ],
)
def test_bad_structure(text: str, column: str, expected: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_toml(text, source="x.toml")
    assert info.value.file == "x.toml"
    assert info.value.column == column
    assert expected in (info.value.expected or "")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ClusterSpecError, match="no such cluster file") as info:
        load_cluster(str(path))
    assert info.value.file == str(path)


def test_semantic_error_in_inline_table_has_no_line() -> None:
    text = 'nodes = [{ gpu_type = "T4", gpus = 0 }]\n'
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_toml(text, source="x.toml")
    assert info.value.column == "nodes[0].gpus"
    assert info.value.line is None


# --------------------------------------------------------------------------------------------------------
# describe_cluster
# --------------------------------------------------------------------------------------------------------


def test_describe_philly() -> None:
    rows = dict(describe_cluster(load_cluster("philly")))
    assert rows["name"] == "philly"
    assert rows["nodes"] == "552"
    assert rows["GPUs"] == "2,490"
    assert rows["GPU type 24GB"].startswith("1,848 GPUs on 231 nodes; 24,576 MiB")
    assert rows["GPU type 12GB"].startswith("642 GPUs on 321 nodes; 12,288 MiB")
    assert rows["racks"] == "36"
    assert rows["tenants"].startswith("11; no quotas")


def test_describe_example_shows_quotas() -> None:
    rows = dict(describe_cluster(load_cluster_file(EXAMPLE)))
    assert rows["tenants"] == "3; quotas total 40 GPUs: vision (24 GPUs), nlp (16 GPUs), interns"
    assert "1 node of 2 x V100" in rows["node shapes"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in describe_cluster(load_cluster("4x8")))


# --------------------------------------------------------------------------------------------------------
# with_quotas, describe_quotas
# --------------------------------------------------------------------------------------------------------


def quotas(cluster: Cluster) -> dict[str, int | None]:
    return {t.name: t.quota_gpus for t in cluster.tenants}


def test_philly_vc_quotas_are_scaled_to_fit_philly() -> None:
    philly = load_cluster("philly")
    c = with_quotas(philly, "philly-vc", ["6214e9", "11cb48", "23dbec"])
    got = quotas(c)
    # floor(q x 2490 / 2816): 512 -> 452, 256 -> 226, 128 -> 113, 64 -> 56; the 11 VCs in file order first.
    assert list(got)[:11] == [t.name for t in philly_vc_tenants()]
    assert got["6214e9"] == 452 and got["7f04ca"] == 226 and got["11cb48"] == 113 and got["ed69ec"] == 56
    assert {name: q for name, q in got.items() if q is not None} == {
        t.name: (t.quota_gpus or 0) * 2490 // 2816 for t in philly_vc_tenants()
    }
    assert sum(q or 0 for q in got.values()) == 2485 <= philly.num_gpus
    # A trace tenant the file does not list is a tenant without a quota.
    assert got["23dbec"] is None and len(got) == 12
    assert c.nodes == philly.nodes and c.name == philly.name
    note = describe_quotas(c, "philly-vc", ["6214e9", "11cb48", "23dbec"])
    assert "scaled by 2,490/2,816" in note and "2,485 of 2,490 GPUs promised to 11 tenants" in note
    assert "trace tenants without a quota: 23dbec" in note
    assert "quota tenants with no job in the trace: 7f04ca" in note


@pytest.mark.parametrize("spec", ["6x8", "10x249", "200x8", "7x13"])
def test_philly_vc_quotas_never_exceed_the_cluster(spec: str) -> None:
    c = load_cluster(spec)
    got = with_quotas(c, "philly-vc", [])
    total = sum(t.quota_gpus or 0 for t in got.tenants)
    assert total <= c.num_gpus
    assert all((t.quota_gpus or 0) >= 1 for t in got.tenants)


def test_philly_vc_quotas_unscaled_where_they_fit() -> None:
    c = with_quotas(load_cluster("philly-revised"), "Philly-VC", [])  # 3,205 GPUs >= 2,816
    assert c.tenants == philly_vc_tenants()
    assert "scaled" not in describe_quotas(c, "philly-vc", [])


def test_philly_vc_quotas_too_small_a_cluster() -> None:
    with pytest.raises(ConfigError, match="too few for the Philly VC quotas"):
        with_quotas(load_cluster("4x8"), "philly-vc", [])


@pytest.mark.parametrize(
    ("cluster", "spec", "tenants", "each"),
    [
        ("4x8", "equal", ["a", "b", "c"], 10),  # floor(32 / 3)
        ("4x8", "equal:0.8", ["a", "b", "c"], 8),  # floor(25.6 / 3)
        ("4x8", " EQUAL:1 ", ["c", "a", "b", "a"], 10),  # case and repeats do not matter
        ("1x100", "equal:0.29", ["a"], 29),  # exactly 29: not floor(28.999...)
        ("4x8", "equal:1/2", ["a", "b"], 8),
    ],
)
def test_equal_quotas(cluster: str, spec: str, tenants: list[str], each: int) -> None:
    c = with_quotas(load_cluster(cluster), spec, tenants)
    assert quotas(c) == {name: each for name in sorted(set(tenants))}
    assert f"promised to {plural(len(set(tenants)), 'tenant')}:" in describe_quotas(c, spec, tenants)


def test_equal_quotas_replace_the_clusters_tenants() -> None:
    c = with_quotas(load_cluster_file(EXAMPLE), "equal:0.5", ["t0", "t1"])
    assert quotas(c) == {"t0": c.num_gpus // 4, "t1": c.num_gpus // 4}


def test_explicit_quotas() -> None:
    c = with_quotas(load_cluster("4x8"), "vision=16, nlp=0,ghost=4", ["vision", "nlp", "other"])
    assert quotas(c) == {"vision": 16, "nlp": 0, "ghost": 4, "other": None}
    note = describe_quotas(c, "vision=16, nlp=0,ghost=4", ["vision", "nlp", "other"])
    assert "20 of 32 GPUs promised to 3 tenants: vision 16, nlp 0, ghost 4" in note
    assert "without a quota: other" in note and "no job in the trace: ghost" in note


def test_no_quotas_is_the_cluster_as_it_is() -> None:
    c = load_cluster_file(EXAMPLE)
    assert with_quotas(c, "none", ["x"]) is c
    assert describe_quotas(c, "none", ["vision"]).startswith("quotas none: 40 of")
    assert (
        describe_quotas(load_cluster("4x8"), "none", []) == "quotas none: none (no tenant of the cluster has a quota)"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bogus", "unknown form"),
        ("", "unknown form"),
        ("equal:", "F must be a number in (0, 1]"),
        ("equal:abc", "F must be a number in (0, 1]"),
        ("equal:nan", "F must be a number in (0, 1]"),
        ("equal:0", "F must be in (0, 1]"),
        ("equal:1.5", "F must be in (0, 1]"),
        ("equal:1/0", "F must be a number in (0, 1]"),
        ("a=4,b", "'b' is not NAME=GPUS"),
        ("=4", "'=4' is not NAME=GPUS"),
        ("a=4,,b=2", "'' is not NAME=GPUS"),
        ("a=x", "the quota of 'a' must be an integer >= 0, got 'x'"),
        ("a=-1", "the quota of 'a' must be an integer >= 0"),
        ("a=1.5", "the quota of 'a' must be an integer >= 0"),
        ("a=1,a=2", "tenant 'a' is given twice"),
    ],
)
def test_bad_quota_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        with_quotas(load_cluster("4x8"), spec, ["a"])
    text = str(info.value)
    assert message in text
    assert "expected philly-vc" in text and "NAME=GPUS" in text  # every error lists the forms


def test_equal_quotas_that_floor_to_nothing() -> None:
    with pytest.raises(ConfigError, match="gives each 0 GPUs"):
        with_quotas(load_cluster("1x2"), "equal", ["a", "b", "c"])


# --------------------------------------------------------------------------------------------------------
# Size limits: a huge count is a located error at once, never minutes of building nodes
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "column", "line", "expected"),
    [
        ("count = 100000000\ngpus = 8", "nodes[0].count", 3, "at most 200,000 (corral's limit on nodes in a cluster)"),
        ("gpus = 9223372036854775807", "nodes[0].gpus", 3, "at most 1,024 (corral's limit on GPUs per node)"),
        ("gpus = 1025", "nodes[0].gpus", 3, "at most 1,024 (corral's limit on GPUs per node)"),
        ("gpus = 8\ngpus_per_switch = 4096", "nodes[0].gpus_per_switch", 4, "at most 1,024"),
        ("gpus = 8\ncount = 2\nracks_of = 300000", "nodes[0].racks_of", 5, "at most 200,000"),
    ],
    ids=["count", "gpus-int64-max", "gpus", "gpus-per-switch", "racks-of"],
)
def test_counts_over_the_limits(group: str, column: str, line: int, expected: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_toml(f'[[nodes]]\ngpu_type = "T4"\n{group}\n', source="big.toml")
    err = info.value
    assert (err.file, err.line, err.column) == ("big.toml", line, column)
    assert err.message == "out of range"
    assert err.expected is not None and "an integer >= 1" in err.expected and expected in err.expected


@pytest.mark.parametrize(
    ("text", "column", "line", "message", "expected"),
    [
        (
            '[[nodes]]\ngpu_type = "T4"\ncount = 150000\ngpus = 8\n',
            "nodes[0].count",
            3,
            "with nodes[0] the cluster would have 1,200,000 GPUs, more than corral's limit",
            "at most 1,000,000 GPUs in a cluster (corral's limit)",
        ),
        (
            '[[nodes]]\ngpu_type = "T4"\ncount = 120000\ngpus = 1\n'
            '[[nodes]]\ngpu_type = "T4"\ncount = 90000\ngpus = 1\n',
            "nodes[1].count",
            7,
            "with nodes[1] the cluster would have 210,000 nodes, more than corral's limit",
            "at most 200,000 nodes in a cluster (corral's limit)",
        ),
        (
            '[[nodes]]\ngpu_type = "T4"\ncount = 1000\ngpus = 1000\n'
            '[[nodes]]\nname = "one-more"\ngpu_type = "T4"\ngpus = 1\n',
            "nodes[1].gpus",
            8,
            "with nodes[1] the cluster would have 1,000,001 GPUs, more than corral's limit",
            "at most 1,000,000 GPUs",
        ),
    ],
    ids=["gpus-in-one-group", "nodes-over-groups", "gpus-over-groups"],
)
def test_totals_over_the_limits(text: str, column: str, line: int, message: str, expected: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_toml(text, source="big.toml")
    err = info.value
    assert (err.file, err.line, err.column, err.message) == ("big.toml", line, column, message)
    assert err.expected is not None and expected in err.expected


def test_the_largest_allowed_cluster_builds() -> None:
    c = parse_cluster_toml('[[nodes]]\ngpu_type = "T4"\ncount = 1000\ngpus = 1000\n')
    assert (len(c.nodes), c.num_gpus) == (1000, 1_000_000)
    assert load_cluster("1x1024").num_gpus == 1024


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("300000x1", "300,000 nodes, more than corral's limit; expected at most 200,000 nodes"),
        ("1x2000", "2,000 GPUs in one node"),
        ("2000x1000", "2,000,000 GPUs, more than corral's limit"),
        ("9" * 5000 + "x8", "at least 1,000,000,000 nodes"),  # int() of it would refuse 5,000 digits
    ],
)
def test_inline_over_the_limits(spec: str, words: str) -> None:
    with pytest.raises(ClusterSpecError, match="corral's limit") as info:
        load_cluster(spec)
    assert words in str(info.value)


def test_inline_reads_ascii_digits_only() -> None:
    assert load_cluster("0004x0008").num_gpus == 32
    for spec in ("\u0664x8", "\uff14x8"):  # Arabic-Indic and full-width 4: Python's int() reads both
        with pytest.raises(ClusterSpecError, match="unknown cluster"):
            load_cluster(spec)


def test_tiresias_spec_over_the_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiresias").mkdir()
    spec = tmp_path / "tiresias" / "n9g9.csv"
    spec.write_text("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1000,1000,8,40,256\n")
    monkeypatch.setenv("CORRAL_DATA_DIR", str(tmp_path))
    with pytest.raises(ClusterSpecError) as info:
        load_cluster("n9g9")
    err = info.value
    assert (err.file, err.line, err.column) == (str(spec), 2, "num_node_p_switch")
    assert err.expected == "at most 200,000 nodes in a cluster (corral's limit)"


# --------------------------------------------------------------------------------------------------------
# TOML that tomllib alone would turn into a traceback
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ('name = "x"\nnodes = ' + "[" * 500 + "]" * 500 + "\n", 2, None),
        ('name = "x"\n' + "a." * 500 + "b = 1\n", 2, "a.a.a.a.<58 more>.a.a.a"),
        ('name = "x"\n' + "[" + "t." * 500 + "u]\n", 2, "t.t.t.t.<58 more>.t.t.t"),
    ],
    ids=["arrays", "dotted-key", "table-header"],
)
def test_nested_500_deep_is_located(tmp_path: Path, text: str, line: int, column: str | None) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text)
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(str(path))
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), line, column)
    assert err.expected == "tables and arrays nested at most 64 deep"


def test_integer_beyond_tomls_range(tmp_path: Path) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_toml('[[nodes]]\ngpu_type = "T4"\ngpus = 9223372036854775808\n', source="x.toml")
    err = info.value
    assert (err.line, err.column, err.message, err.got) == (
        3,
        "nodes[0].gpus",
        "integer out of range",
        "9223372036854775808",
    )


def test_gpus_as_a_huge_float_is_the_wrong_type() -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_toml('[[nodes]]\ngpu_type = "T4"\ngpus = 1e308\n', source="x.toml")
    assert (info.value.line, info.value.column, info.value.got) == (3, "nodes[0].gpus", "1e+308 (float)")
