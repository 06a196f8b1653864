"""corral.core.sorted_groups: groups read in sorted order whether they are small lists or grown SortedLists."""

from __future__ import annotations

import random
from bisect import bisect_right

import pytest
from sortedcontainers import SortedList

from corral.core.sorted_groups import (
    SMALL,
    Group,
    add_entry,
    bisect_right_entry,
    has_entry,
    remove_entry,
    remove_sorted,
)


def test_random_adds_and_removes_keep_every_group_sorted_like_a_reference() -> None:
    rng = random.Random(7)
    groups: dict[str, Group] = {}
    reference: dict[str, list[tuple[float, int]]] = {}
    seq = 0
    for _ in range(6000):
        key = rng.choice("abc")
        if reference.get(key) and rng.random() < 0.3:
            entry = rng.choice(reference[key])
            remove_entry(groups, key, entry)
            reference[key].remove(entry)
            if not reference[key]:
                del reference[key]
        else:
            seq += 1
            entry = (float(rng.randrange(50)), seq)
            add_entry(groups, key, entry)
            reference.setdefault(key, []).append(entry)
            reference[key].sort()
        assert sorted(groups) == sorted(reference)  # an emptied group is dropped
        assert list(groups.get(key, ())) == reference.get(key, [])
    probe = (25.0, seq // 2)
    for key, entries in reference.items():
        group = groups[key]
        assert bisect_right_entry(group, probe) == bisect_right(entries, probe)
        assert all(has_entry(group, e) for e in entries)
        assert not has_entry(group, (25.5, -1))


def test_a_group_grows_into_a_sorted_list_past_small_and_reads_the_same() -> None:
    groups: dict[int, Group] = {}
    entries = [(i % 97, i) for i in range(SMALL + 10)]
    for e in reversed(entries):
        add_entry(groups, 0, e)
    group = groups[0]
    assert isinstance(group, SortedList)
    assert list(group) == sorted(entries)
    assert bisect_right_entry(group, (50, 0)) == bisect_right(sorted(entries), (50, 0))
    for e in entries:
        remove_entry(groups, 0, e)
    assert groups == {}


@pytest.mark.parametrize("size", [1, SMALL + 1])
def test_removing_an_entry_that_is_not_there_is_a_value_error(size: int) -> None:
    groups: dict[int, Group] = {}
    for i in range(size):
        add_entry(groups, 0, (i, i))
    with pytest.raises(ValueError, match="not in list"):
        remove_entry(groups, 0, (-1, -1))
    with pytest.raises(ValueError, match="not in list"):
        remove_entry(groups, 1, (0, 0))
    assert len(groups[0]) == size


def test_remove_sorted_takes_out_exactly_that_item_and_refuses_a_missing_one() -> None:
    items = [1, 3, 3, 5, 8]
    remove_sorted(items, 3)
    remove_sorted(items, 8)
    assert items == [1, 3, 5]
    for missing in (0, 4, 9):
        with pytest.raises(ValueError, match="not in list"):
            remove_sorted(items, missing)
    assert items == [1, 3, 5]
