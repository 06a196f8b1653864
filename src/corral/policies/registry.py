"""The policy registry: registering a policy is one decorator; the CLI finds policies here by name.

A policy spec string names a policy and, optionally, its options: ``"fifo"``,
``"sjf:placement=spread,backfill=false"``. Tuple-valued options separate items with ``/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

from corral.core.errors import ConfigError
from corral.policies.base import BasePolicy, build_config

P = TypeVar("P", bound=type[BasePolicy])

_REGISTRY: dict[str, type[BasePolicy]] = {}


def register_policy(cls: P) -> P:
    """Class decorator: make a policy available by its ``name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a non-empty `name`")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TypeError(f"two policies are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


# One entry per policy module shipped with corral (a module may register several policies).
BUILTIN_MODULES = ("baseline", "tiresias", "themis", "gandiva", "antman", "hived", "iadeep")


def _load_builtin() -> None:
    # Importing the policy modules runs their decorators. Kept here so `import corral.policies` stays cheap
    # and free of import cycles.
    for module in BUILTIN_MODULES:
        importlib.import_module(f"corral.policies.{module}")


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[BasePolicy]:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; known policies: {', '.join(sorted(_REGISTRY))}") from None


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
