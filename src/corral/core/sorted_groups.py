"""Sorted lists: entries kept sorted in groups under keys (the pending queues of the cluster state and of the
policies), and removal from a plain sorted list by bisection (the indexes of the state, the planner and AntMan).

A queue split by key (a job's shape, tenant or class) has many short-lived groups: in most replays a group holds
one or a few jobs, made when the first comes and dropped when the last leaves. A
:class:`sortedcontainers.SortedList` per group cost its Python code on every one of those steps (made, added to,
removed from: about 3% of a Philly replay, issue 20). So a group is a plain list kept sorted while it is small
(:func:`bisect.insort` and a ``del``, both in C, moving at most :data:`SMALL` machine words), and becomes a
``SortedList`` for good when it grows past that, where a list's inserts and deletes would move too much.

Either is a sorted :class:`~collections.abc.Sequence` to its readers (iteration, indexing, ``len``, ``in``), so the
order they read is the same whichever a group is. Entries must be unique within a group (the queues end theirs
with a sequence number or a job id) and comparable with each other.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Hashable, MutableMapping, Sequence
from typing import Any

from sortedcontainers import SortedList

SMALL = 2048  # the largest group kept as a plain list (a delete at its front moves 16 KiB)

Group = Sequence[Any]  # a sorted list of entries (a ``list`` or a ``SortedList``)


def add_entry(groups: MutableMapping[Any, Group], key: Hashable, entry: Any) -> None:
    """File ``entry`` under ``key``, in order (a new key starts a group)."""
    group = groups.get(key)
    if group is None:
        groups[key] = [entry]
    elif type(group) is list:
        if len(group) < SMALL:
            insort(group, entry)
        else:
            grown = SortedList(group)
            grown.add(entry)
            groups[key] = grown
    else:
        assert isinstance(group, SortedList)
        group.add(entry)


def remove_sorted(items: list[Any], item: Any) -> None:
    """Remove ``item`` from the ascending list ``items`` by bisection (``list.remove`` compares its way along the
    list); ``ValueError`` if it is not there."""
    i = bisect_left(items, item)
    if i == len(items) or items[i] != item:
        raise ValueError(f"{item!r} not in list")
    del items[i]


def remove_entry(groups: MutableMapping[Any, Group], key: Hashable, entry: Any) -> None:
    """Take ``entry`` out of the group under ``key`` (dropping the group when it empties); ``ValueError`` if it is
    not there, as ``SortedList.remove`` says."""
    group = groups.get(key)
    if group is None:
        raise ValueError(f"{entry!r} not in list")
    if type(group) is list:
        remove_sorted(group, entry)
    else:
        assert isinstance(group, SortedList)
        group.remove(entry)
    if not group:
        del groups[key]


def has_entry(group: Group, entry: Any) -> bool:
    """Whether ``entry`` is in ``group`` (by bisection: a list's ``in`` would compare with every entry)."""
    if type(group) is list:
        i = bisect_left(group, entry)
        return i < len(group) and group[i] == entry
    return entry in group


def bisect_right_entry(group: Group, entry: Any) -> int:
    """The index after every entry of ``group`` that is ``<= entry``."""
    if type(group) is list:
        return bisect_right(group, entry)
    assert isinstance(group, SortedList)
    at: int = group.bisect_right(entry)
    return at
