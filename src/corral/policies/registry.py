"""The policy registry: one table of the built-in policies by name; the CLI and the live controller find policies here.

:data:`BUILTIN_POLICIES` names each built-in policy's class as ``"module:Class"``, imported only when the policy is
asked for by name (so ``import corral.policies`` stays cheap and free of import cycles, and a run imports the one
policy it uses). Adding a policy to corral is one module and one line in that table. A policy defined outside
the package (a user's, a test's) registers itself with the :func:`register_policy` class decorator.

A policy spec string names a policy and, optionally, its options: ``"fifo"``,
``"sjf:placement=spread,backfill=false"``. Tuple-valued options separate items with ``/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

from corral.core.errors import ConfigError
from corral.core.options import build_config
from corral.policies.framework.contract import BasePolicy

P = TypeVar("P", bound=type[BasePolicy])

BUILTIN_POLICIES: Mapping[str, str] = MappingProxyType(
    {
        "fifo": "corral.policies.baseline:FifoPolicy",
        "yarn-cs": "corral.policies.baseline:YarnCsPolicy",
        "sjf": "corral.policies.baseline:SjfPolicy",
        "srtf": "corral.policies.baseline:SrtfPolicy",
        "tiresias": "corral.policies.tiresias:TiresiasPolicy",
        "themis": "corral.policies.themis:ThemisPolicy",
        "gandiva": "corral.policies.gandiva:GandivaPolicy",
        "antman": "corral.policies.antman.policy:AntManPolicy",
        "hived": "corral.policies.hived.policy:HivedPolicy",
        "iadeep": "corral.policies.iadeep.policy:IADeepPolicy",
    }
)
"""Each built-in policy's name -> ``"module:Class"``; the class's own ``name`` is the key."""

_LOADED: dict[str, type[BasePolicy]] = {}  # built-in policies imported so far
_REGISTERED: dict[str, type[BasePolicy]] = {}  # policies from outside the package, by @register_policy


def _builtin(name: str) -> type[BasePolicy]:
    cls = _LOADED.get(name)
    if cls is None:
        module, _, attr = BUILTIN_POLICIES[name].partition(":")
        found = getattr(importlib.import_module(module), attr)
        if not (isinstance(found, type) and issubclass(found, BasePolicy) and found.name == name):
            raise TypeError(f"the policy table's entry {name!r} -> {BUILTIN_POLICIES[name]!r} is not a policy named so")
        cls = _LOADED[name] = found
    return cls


def register_policy(cls: P) -> P:
    """Class decorator: make a policy from outside corral's package available by its ``name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a non-empty `name`")
    known = _builtin(cls.name) if cls.name in BUILTIN_POLICIES else _REGISTERED.get(cls.name)
    if known is not None and known is not cls:
        raise TypeError(f"two policies are named {cls.name!r}")
    if cls.name not in BUILTIN_POLICIES:
        _REGISTERED[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    return sorted({*BUILTIN_POLICIES, *_REGISTERED})


def policy_class(name: str) -> type[BasePolicy]:
    if name in BUILTIN_POLICIES:
        return _builtin(name)
    try:
        return _REGISTERED[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; known policies: {', '.join(policy_names())}") from None


def parse_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"name:key=value,key=value"`` -> ``("name", {"key": "value", ...})``."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"policy spec {spec!r}: expected key=value, got {part!r}")
        options[key.strip()] = value
    if not name:
        raise ConfigError(f"policy spec {spec!r} has no policy name")
    return name, options


def make_policy(spec: str, *, seed: int = 0) -> BasePolicy:
    """Build a policy from a spec string such as ``"srtf:placement=spread"``."""
    name, options = parse_policy_spec(spec)
    cls = policy_class(name)
    return cls(build_config(cls.Config, options, f"policy {name!r}"), seed=seed)


PolicyFactory = Callable[[], BasePolicy]
