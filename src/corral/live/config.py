"""The configuration of ``corral serve``: where the state lives, what to listen on, which policy schedules, which
GPUs, and the tenants with their quotas and API tokens.

It comes from an optional TOML file, overridden by command-line flags (:func:`load_config`). Everything is
checked here, at the edge: an error names the file, the key and what was expected.

Example ``corral.toml``::

    [server]
    host = "127.0.0.1"          # the default; a non-loopback address exposes the API to the network
    port = 8473
    policy = "antman"           # a policy spec, as for `corral simulate --policy`
    gpus = 4                    # 4 stand-in GPUs (jobs run on the CPU); leave out to use the real GPUs (NVML)
    state_dir = "state"         # relative to this file's folder; holds corral.db, logs, checkpoints, tokens
    grace_s = 30                # seconds a preempted job has to checkpoint and exit
    # admin_token_env = "CORRAL_ADMIN_TOKEN"   # else one is generated into state_dir/admin.token

    [[tenants]]
    name = "vision"
    quota_gpus = 2              # guaranteed GPUs; leave out for no promise and no cap
    token_env = "CORRAL_TOKEN_VISION"   # or: token = "..." (at least 16 characters)

    [[tenants]]
    name = "nlp"
    quota_gpus = 2
    token_env = "CORRAL_TOKEN_NLP"
    run_as = "nlp-jobs"         # run its jobs as this Unix user (corral serve must run as root)

Keys of ``[server]``: ``host``, ``port`` (1..65535), ``policy`` (any policy but those that order jobs by their
duration, SJF and SRTF: a live job has none, so they would reject every job; refused at start-up), ``gpus``
(stand-in GPUs, 1..4096), ``stand_in_mem_mib`` (the memory of each stand-in GPU, default 16384; also that of the
stand-ins of a Ray node without NVML), ``state_dir``, ``grace_s``, ``max_body_bytes``, ``admin_token`` or
``admin_token_env``, ``ray`` (``auto``, a Ray address, or ``local:NxG``: schedule the GPU nodes of a Ray cluster;
see ``docs/live.md``, "Many machines"), ``ray_expect`` (with Ray: nodes that may join later), ``checkpoint_dir``
(with Ray: a directory every node shares), ``metrics_token`` (``true``: ``GET /metrics`` needs the admin
token; default ``false``), ``warm_starts`` (``true``: jobs submitted with ``--warm`` are forked from a process
with torch imported; default ``false``; docs/live.md, "Warm starts"), ``dashboard_sample_s`` and
``dashboard_history_s`` (the dashboard's charts: a sample every 5 s, the last hour kept, by default),
``estimate_interval_s`` (how often the pending jobs' start times are estimated, in a worker process; default 30;
0: only on request; docs/live.md, "Estimated start times").
Keys of each ``[[tenants]]``: ``name``, ``quota_gpus`` (>= 0), ``token`` or ``token_env``, ``run_as``. Without
``[[tenants]]`` there is one tenant, ``default``, with no quota and no token of its own.

``run_as`` names the Unix user the tenant's jobs run as (uid, primary gid and supplementary groups), so that they
cannot read the server's state or other tenants' files (see the trust model in ``docs/live.md``). The user must
exist and must not be root, ``corral serve`` must run as root, and no two tenants may share a user. When some
tenants have a ``run_as`` and the server runs as root, every tenant must have one: the jobs of one without would
run as root.

The admin token sees and acts on every tenant's jobs. When the configuration gives none, :func:`ensure_admin_token`
generates one on the first start and keeps it in ``state_dir/admin.token`` (mode 0600), reused on later starts;
``corral serve`` also writes ``state_dir/server.json`` (the URL and the server's pid) so that the other ``corral``
commands find the server and the token by themselves. The state directory is made 0700 and these files 0600,
also when they existed before.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pwd
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.core.errors import ConfigError, InputError
from corral.core.toml import parse_toml

log = logging.getLogger("corral.live.config")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8473
DEFAULT_STATE_DIR = ".corral"
ADMIN_TOKEN_FILE = "admin.token"
SERVER_FILE = "server.json"
DB_FILE = "corral.db"
MIN_TOKEN_CHARS = 16
MAX_STAND_IN_GPUS = 4096  # as corral.live.agent.gpus.MAX_STAND_IN_GPUS
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_SERVER_KEYS = (
    "host",
    "port",
    "policy",
    "gpus",
    "stand_in_mem_mib",
    "state_dir",
    "grace_s",
    "max_body_bytes",
    "admin_token",
    "admin_token_env",
    "ray",
    "ray_expect",
    "checkpoint_dir",
    "metrics_token",
    "warm_starts",
    "dashboard_sample_s",
    "dashboard_history_s",
    "estimate_interval_s",
)
_TENANT_KEYS = ("name", "quota_gpus", "token", "token_env", "run_as")
_CLI = "<command line>"
_NOTHING = object()
_FLAGS = {
    "host": "--host",
    "port": "--port",
    "policy": "--policy",
    "gpus": "--gpus",
    "state_dir": "--state-dir",
    "grace_s": "--grace",
    "stand_in_mem_mib": "--stand-in-mem-mib",
    "max_body_bytes": "--max-body-bytes",
    "admin_token": "--admin-token",
    "ray": "--ray",
    "ray_expect": "--ray-expect",
    "checkpoint_dir": "--checkpoint-dir",
}


class ConfigFileError(InputError):
    """A bad value in the serve configuration: ``file`` is the TOML file (or ``<command line>``), ``column`` the
    key (``server.port``, ``tenants[1].token``), ``got`` the offending value (any type; shown as Python writes
    it)."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        column: str | None = None,
        expected: str | None = None,
        got: object = _NOTHING,
    ) -> None:
        shown = None if got is _NOTHING else repr(got)
        super().__init__(message, file=file, column=column, expected=expected, got=shown)

    def _render(self) -> str:
        where = self.file or "<config>"
        head = f"{where}: {self.column}: {self.message}" if self.column else f"{where}: {self.message}"
        parts = [head]
        if self.expected is not None:
            parts.append(f"expected {self.expected}")
        if self.got is not None:
            parts.append(f"got {self.got}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A tenant: its name, its GPU quota (``None``: no promise and no cap), its own API token (``None``: the
    tenant is used through the admin token only) and the Unix user its jobs run as (``None``: the server's)."""

    name: str
    quota_gpus: int | None = None
    token: str | None = None
    run_as: str | None = None


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything ``corral serve`` needs. ``gpus=None`` discovers the real GPUs with NVML; ``gpus=N`` declares N
    stand-in GPUs of ``stand_in_mem_mib`` each. ``admin_token=None`` means "the one in ``state_dir/admin.token``,
    generated on first start" (see :func:`ensure_admin_token`)."""

    state_dir: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    policy: str = "fifo"
    gpus: int | None = None
    stand_in_mem_mib: int = 16384
    tenants: tuple[TenantConfig, ...] = (TenantConfig("default"),)
    admin_token: str | None = None
    grace_s: float = 30.0
    max_body_bytes: int = 64 * 1024
    ray: str | None = None  # None: this machine alone; "auto", a Ray address, or "local:NxG" (docs/live.md)
    checkpoint_dir: Path | None = None  # with Ray: a directory every node shares (default STATE_DIR/checkpoints)
    # With Ray: nodes that may join later, ``NAME:GPUS`` or ``NAME:GPUS:TYPE`` (their corral.node label, GPU count
    # and type): part of the cluster from the start, lost until a Ray node with that label and those GPUs is alive.
    ray_expect: tuple[str, ...] = ()
    # Whether GET /metrics needs the admin token (Prometheus' bearer_token). Off by default: the metrics name no
    # command, environment or token, and a scraper usually has none (corral.live.api.metrics).
    metrics_token: bool = False
    # Warm starts (corral.live.agent.zygote): each node's agent keeps a process with torch imported to fork the
    # runs of jobs submitted with --warm. Off by default: the process holds a few hundred MiB.
    warm_starts: bool = False
    # The dashboard's history (corral.live.dashboard.history): one sample every dashboard_sample_s, the last
    # dashboard_history_s kept (its memory grows with both; the module's docstring says how much).
    dashboard_sample_s: float = 5.0
    dashboard_history_s: float = 3600.0
    # Start-time estimates (corral.live.controller.estimates): a forecast of the queue every estimate_interval_s, in
    # a worker process (0: only on request, POST /v1/estimates and corral submit --test-only).
    estimate_interval_s: float = 30.0

    def __post_init__(self) -> None:
        # The same checks as load_config, for configs built in code (tests, embedding); the file's own errors
        # are caught first there, with the file named.
        _check_config(self, "<config>")

    @property
    def db_path(self) -> Path:
        return self.state_dir / DB_FILE

    @property
    def admin_token_path(self) -> Path:
        return self.state_dir / ADMIN_TOKEN_FILE

    @property
    def server_file(self) -> Path:
        return self.state_dir / SERVER_FILE

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def tenant(self, name: str) -> TenantConfig | None:
        for t in self.tenants:
            if t.name == name:
                return t
        return None


# -- loading --------------------------------------------------------------------------------------------------
def load_config(path: Path | str | None = None, **overrides: Any) -> ServeConfig:
    """The configuration from the TOML file at ``path`` (or the defaults without one), with ``overrides`` (the
    command-line flags: any :class:`ServeConfig` field but ``tenants``; a ``None`` value means "not given")
    applied on top. Raises :class:`ConfigFileError` (an :class:`InputError`) naming the file and key."""
    unknown_overrides = set(overrides) - (set(_SERVER_KEYS) - {"admin_token_env"})
    if unknown_overrides:
        raise TypeError(f"load_config: unknown overrides {sorted(unknown_overrides)}")
    file = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    base_dir = Path.cwd()
    if path is not None:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise ConfigFileError(f"cannot read the configuration file: {e.strerror or e}", file=file) from None
        try:
            data = parse_toml(raw.decode("utf-8"), file=file)  # not TOML: a located TomlError (an InputError)
        except UnicodeDecodeError:
            raise ConfigFileError("not UTF-8 text", file=file, expected="a TOML file") from None
        base_dir = p.resolve().parent

    for key in data:
        if key not in ("server", "tenants"):
            raise ConfigFileError(
                "unknown table", file=file, column=key, expected="only [server] and [[tenants]]", got=key
            )
    server = data.get("server", {})
    if not isinstance(server, dict):
        raise ConfigFileError("must be a table", file=file, column="server", expected="[server]")
    _no_unknown_keys(server, _SERVER_KEYS, file, "server")

    values: dict[str, Any] = {}
    if "host" in server:
        values["host"] = _string(server, "host", file, "server")
    if "port" in server:
        values["port"] = _int(server, "port", file, "server", low=1, high=65535)
    if "policy" in server:
        values["policy"] = _string(server, "policy", file, "server")
    if "gpus" in server:
        values["gpus"] = _int(server, "gpus", file, "server", low=1, high=MAX_STAND_IN_GPUS)
    if "stand_in_mem_mib" in server:
        values["stand_in_mem_mib"] = _int(server, "stand_in_mem_mib", file, "server", low=1)
    if "grace_s" in server:
        values["grace_s"] = _seconds(server, "grace_s", file, "server")
    if "max_body_bytes" in server:
        values["max_body_bytes"] = _int(server, "max_body_bytes", file, "server", low=1024)
    if "state_dir" in server:
        values["state_dir"] = base_dir / Path(_string(server, "state_dir", file, "server")).expanduser()
    if "ray" in server:
        values["ray"] = _string(server, "ray", file, "server")
    if "ray_expect" in server:
        expect = server["ray_expect"]
        if not isinstance(expect, list) or not all(isinstance(x, str) for x in expect):
            raise ConfigFileError(
                "bad value", file=file, column="server.ray_expect", expected='a list of "NAME:GPUS[:TYPE]"', got=expect
            )
        values["ray_expect"] = tuple(expect)
    if "checkpoint_dir" in server:
        values["checkpoint_dir"] = base_dir / Path(_string(server, "checkpoint_dir", file, "server")).expanduser()
    for key in ("metrics_token", "warm_starts"):
        if key in server:
            flag = server[key]
            if not isinstance(flag, bool):
                raise ConfigFileError(
                    "bad value", file=file, column=f"server.{key}", expected="true or false", got=flag
                )
            values[key] = flag
    for key in ("dashboard_sample_s", "dashboard_history_s", "estimate_interval_s"):
        if key in server:
            values[key] = _seconds(server, key, file, "server")
    token = _token(server, "admin_token", "admin_token_env", file, "server")
    if token is not None:
        values["admin_token"] = token

    values["tenants"] = _tenants(data.get("tenants"), file)
    if path is not None and ("admin_token" in server or any(t.token for t in values["tenants"])):
        _warn_if_readable(Path(path))

    # Command-line flags win over the file; they are checked like the file's values, named as flags.
    policy_from = (file, "server.policy")
    for key, value in overrides.items():
        if value is None:
            continue
        flag = _FLAGS.get(key, key)
        if key in ("state_dir", "checkpoint_dir"):
            values[key] = Path(value).expanduser().absolute()
        elif key in ("port", "gpus", "stand_in_mem_mib", "max_body_bytes"):
            low, high = {"port": (1, 65535), "gpus": (1, MAX_STAND_IN_GPUS)}.get(key, (1, None))
            values[key] = _int({flag: value}, flag, _CLI, "", low=low, high=high)
        elif key == "grace_s":
            values[key] = _seconds({flag: value}, flag, _CLI, "")
        elif key == "admin_token":
            _check_token(value, _CLI, flag)
            values[key] = value
        elif key == "ray_expect":
            if value:  # a flag given several times; none given: the file's list stands
                values[key] = tuple(value)
        else:
            values[key] = _string({flag: value}, flag, _CLI, "")
            if key == "policy":
                policy_from = (_CLI, flag)
    values["state_dir"] = Path(values.get("state_dir", Path.cwd() / DEFAULT_STATE_DIR)).absolute()
    _check_policy(values.get("policy", "fifo"), *policy_from)
    _check_config_values(values, file)
    return ServeConfig(**values)


def ensure_admin_token(config: ServeConfig) -> ServeConfig:
    """``config`` with its admin token set: the configured one, else the one kept in ``state_dir/admin.token``,
    else a new one written there (mode 0600). Creates ``state_dir`` if needed."""
    if config.admin_token is not None:
        return config
    path = config.admin_token_path
    try:
        make_state_dir(config.state_dir)
        if path.exists():
            os.chmod(path, 0o600)  # kept by an earlier corral that may have been less careful
            token = path.read_text(encoding="utf-8").strip()
            if len(token) < MIN_TOKEN_CHARS:
                raise ConfigFileError(
                    "the kept admin token is too short",
                    file=str(path),
                    expected=f"at least {MIN_TOKEN_CHARS} characters (delete the file to get a new token)",
                )
        else:
            token = secrets.token_urlsafe(32)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(token + "\n")
    except OSError as e:
        raise ConfigError(f"cannot keep the admin token in {path}: {e.strerror or e}") from None
    return dataclasses.replace(config, admin_token=token)


def write_server_file(config: ServeConfig, url: str, pid: int) -> Path:
    """Write ``state_dir/server.json`` (``{"url": ..., "pid": ...}``), replacing any earlier one atomically."""
    path = config.server_file
    tmp = path.with_name(path.name + ".tmp")
    try:
        make_state_dir(config.state_dir)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(fd, 0o600)
            f.write(json.dumps({"url": url, "pid": pid}) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def make_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` (0700), or make an existing one 0700 when it is looser. (The agent opens it to 0711
    when a tenant's run_as user must pass through; see :mod:`corral.live.agent`.)"""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = state_dir.stat().st_mode & 0o777
    if mode & 0o066:  # readable or writable by others: never right, whatever corral did before
        os.chmod(state_dir, 0o700)


def remove_server_file(config: ServeConfig, pid: int) -> None:
    """Remove ``state_dir/server.json`` if it is still this server's (``pid``)."""
    path = config.server_file
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


# -- checks ---------------------------------------------------------------------------------------------------
def _key(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def _no_unknown_keys(table: Mapping[str, Any], known: tuple[str, ...], file: str, name: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigFileError(
                "unknown key", file=file, column=_key(name, key), expected=f"one of {', '.join(known)}", got=key
            )


def _string(table: Mapping[str, Any], key: str, file: str, name: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigFileError("bad value", file=file, column=_key(name, key), expected="a non-empty string", got=value)
    return value.strip()


def _int(
    table: Mapping[str, Any], key: str, file: str, name: str, *, low: int | None = None, high: int | None = None
) -> int:
    value = table[key]
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and ((low is not None and value < low) or (high is not None and value > high)):
        ok = False
    if not ok:
        if low is not None and high is not None:
            expected = f"an integer from {low} to {high}"
        elif low is not None:
            expected = f"an integer >= {low}"
        else:
            expected = "an integer"
        raise ConfigFileError("bad value", file=file, column=_key(name, key), expected=expected, got=value)
    return int(value)


def _seconds(table: Mapping[str, Any], key: str, file: str, name: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 <= value < math.inf):
        raise ConfigFileError(
            "bad value", file=file, column=_key(name, key), expected="a number of seconds >= 0", got=value
        )
    return float(value)


def _token(table: Mapping[str, Any], key: str, env_key: str, file: str, name: str) -> str | None:
    if key in table and env_key in table:
        raise ConfigFileError(
            f"give either {key} or {env_key}, not both", file=file, column=_key(name, key), expected="one of the two"
        )
    if key in table:
        value = table[key]
        if not isinstance(value, str):
            raise ConfigFileError("bad value", file=file, column=_key(name, key), expected="a string", got=value)
        _check_token(value, file, _key(name, key))
        return value
    if env_key in table:
        var = _string(table, env_key, file, name)
        value = os.environ.get(var)
        if value is None:
            raise ConfigFileError(
                f"the environment variable {var} is not set",
                file=file,
                column=_key(name, env_key),
                expected=f"{var} to hold the token",
            )
        _check_token(value, file, f"{_key(name, env_key)} (${var})")
        return value
    return None


def _warn_if_readable(path: Path) -> None:
    """A configuration that gives tokens literally should be the server's alone to read."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return
    if mode & 0o044:
        log.warning(
            "%s gives API tokens and is readable by other users (mode %04o): chmod 600 it, or give the tokens "
            "through token_env / admin_token_env",
            path,
            mode,
        )


def _check_token(token: str, file: str, key: str) -> None:
    if len(token) < MIN_TOKEN_CHARS or token != token.strip() or not token.isprintable():
        raise ConfigFileError(
            "bad token",
            file=file,
            column=key,
            expected=f"at least {MIN_TOKEN_CHARS} printable characters without surrounding spaces "
            f"(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')",
        )


def _tenants(raw: Any, file: str) -> tuple[TenantConfig, ...]:
    if raw is None:
        return (TenantConfig("default"),)
    if not isinstance(raw, list) or not raw:
        raise ConfigFileError(
            "bad value", file=file, column="tenants", expected="one or more [[tenants]] tables", got=raw
        )
    out: list[TenantConfig] = []
    for i, entry in enumerate(raw):
        name = f"tenants[{i}]"
        if not isinstance(entry, dict):
            raise ConfigFileError("bad value", file=file, column=name, expected="a [[tenants]] table", got=entry)
        _no_unknown_keys(entry, _TENANT_KEYS, file, name)
        if "name" not in entry:
            raise ConfigFileError("missing key", file=file, column=f"{name}.name", expected="the tenant's name")
        tenant_name = _string(entry, "name", file, name)
        if not TENANT_NAME.match(tenant_name):
            raise ConfigFileError(
                "bad tenant name",
                file=file,
                column=f"{name}.name",
                expected="1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit",
                got=tenant_name,
            )
        quota = _int(entry, "quota_gpus", file, name, low=0) if "quota_gpus" in entry else None
        token = _token(entry, "token", "token_env", file, name)
        run_as = _string(entry, "run_as", file, name) if "run_as" in entry else None
        out.append(TenantConfig(tenant_name, quota, token, run_as))
    return tuple(out)


def _check_policy(spec: str, file: str, key: str) -> None:
    from corral.policies.registry import make_policy  # imports every policy module: only when serving

    try:
        policy = make_policy(spec)
    except ConfigError as e:
        raise ConfigFileError(str(e), file=file, column=key, expected="a policy spec (see `corral policies`)") from None
    if policy.needs_durations:  # SJF, SRTF; Themis estimates a job without one from the time it has run
        # It would start, then reject every job at submission ("needs job durations (an oracle)"): say so now.
        raise ConfigFileError(
            f"{policy.name} orders jobs by their duration, which only a trace gives (an oracle); a live job has "
            "none, so it would reject every job",
            file=file,
            column=key,
            expected=f"a policy that needs no durations: {_policies_without_durations()}",
            got=spec,
        )


def _policies_without_durations() -> str:
    """The registered policies that run live jobs, Tiresias first (it approximates shortest-job-first without
    knowing durations), for the message that refuses one that does not."""
    from corral.policies.registry import make_policy, policy_names

    usable = []
    for name in policy_names():
        try:
            if not make_policy(name).needs_durations:
                usable.append(name)
        except ConfigError:  # a registered policy that needs options to be built: not one to suggest bare
            continue
    if "tiresias" in usable:
        usable.remove("tiresias")
        usable.insert(0, "tiresias (shortest-job-first without knowing durations: least attained service first)")
    return ", ".join(usable)


def _check_config_values(values: Mapping[str, Any], file: str) -> None:
    tenants: tuple[TenantConfig, ...] = values.get("tenants", ())
    names: set[str] = set()
    tokens: dict[str, str] = {}
    admin = values.get("admin_token")
    if admin is not None:
        tokens[admin] = "server.admin_token"
    for i, t in enumerate(tenants):
        if t.name in names:
            raise ConfigFileError(
                "duplicate tenant name", file=file, column=f"tenants[{i}].name", expected="unique names", got=t.name
            )
        names.add(t.name)
        if t.token is not None:
            if t.token in tokens:
                raise ConfigFileError(
                    f"the same token as {tokens[t.token]}",
                    file=file,
                    column=f"tenants[{i}].token",
                    expected="a token of its own for each tenant and the admin",
                )
            tokens[t.token] = f"tenants[{i}].token"
    _check_run_as(tenants, file)


def _check_run_as(tenants: tuple[TenantConfig, ...], file: str) -> None:
    """Each ``run_as`` names an existing unprivileged user of its own, and the server can become it (see the
    module docstring)."""
    users: dict[int, str] = {}
    for i, t in enumerate(tenants):
        if t.run_as is None:
            continue
        column = f"tenants[{i}].run_as"
        if not isinstance(t.run_as, str) or not t.run_as.strip():
            raise ConfigFileError("bad value", file=file, column=column, expected="a Unix user name", got=t.run_as)
        try:
            uid = pwd.getpwnam(t.run_as).pw_uid
        except KeyError:
            raise ConfigFileError(
                f"no Unix user {t.run_as!r} on this machine",
                file=file,
                column=column,
                expected="an existing user (create it with useradd)",
            ) from None
        if uid == 0:
            raise ConfigFileError(
                "a tenant's jobs must not run as root", file=file, column=column, expected="an unprivileged user"
            )
        if os.geteuid() != 0:
            raise ConfigFileError(
                f"corral serve runs as uid {os.geteuid()}, not root, so it cannot start jobs as {t.run_as!r}",
                file=file,
                column=column,
                expected="corral serve run as root, or no run_as",
            )
        if uid in users:
            raise ConfigFileError(
                f"the same user as {users[uid]}: these tenants' jobs could read each other's files",
                file=file,
                column=column,
                expected="a user of its own for each tenant",
            )
        users[uid] = column
    if users and os.geteuid() == 0:
        for i, t in enumerate(tenants):
            if t.run_as is None:
                raise ConfigFileError(
                    "no run_as: a server running as root would run this tenant's jobs as root, able to read "
                    "every other tenant's files and the server's",
                    file=file,
                    column=f"tenants[{i}].run_as",
                    expected=f"a user of its own, as {next(iter(users.values()))} has",
                )


_RAY_LOCAL = re.compile(r"local:([0-9]{1,2})x([0-9]{1,2})")


def _check_ray(spec: str, file: str) -> None:
    """``auto``, a Ray address (``HOST:PORT``, ``ray://HOST:PORT``), or ``local:NxG`` (1..16 nodes of 1..64 GPUs)."""
    expected = "auto, a Ray address (HOST:PORT), or local:NxG with 1..16 nodes of 1..64 stand-in GPUs"
    m = _RAY_LOCAL.fullmatch(spec)
    if m is not None:
        n, g = int(m.group(1)), int(m.group(2))
        if 1 <= n <= 16 and 1 <= g <= 64:
            return
        raise ConfigFileError("bad value", file=file, column="ray", expected=expected, got=spec)
    if spec == "auto" or (spec and not spec.startswith("local") and ":" in spec and spec.strip() == spec):
        return
    raise ConfigFileError("bad value", file=file, column="ray", expected=expected, got=spec)


_EXPECTED = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,62}):([0-9]{1,3})(?::([^:\s]{1,64}))?")


def parse_expected_node(spec: str, file: str = _CLI) -> tuple[str, int, str | None]:
    """``NAME:GPUS`` or ``NAME:GPUS:TYPE`` (``ray_expect``, ``--ray-expect``): a node that may join the Ray cluster
    later, by its ``corral.node`` label, its GPU count (1..256) and GPU type (as ``corral cluster`` names it;
    default: the one type of the nodes present)."""
    m = _EXPECTED.fullmatch(spec) if isinstance(spec, str) else None
    if m is None or not 1 <= int(m.group(2)) <= 256:
        raise ConfigFileError(
            "bad value", file=file, column="ray_expect", expected="NAME:GPUS or NAME:GPUS:TYPE, 1..256 GPUs", got=spec
        )
    return m.group(1), int(m.group(2)), m.group(3)


def _check_config(config: ServeConfig, file: str) -> None:
    if not isinstance(config.state_dir, Path):
        raise ConfigFileError("bad value", file=file, column="state_dir", expected="a Path", got=config.state_dir)
    if not config.host:
        raise ConfigFileError("bad value", file=file, column="host", expected="a non-empty host", got=config.host)
    _int({"port": config.port}, "port", file, "", low=1, high=65535)
    if config.gpus is not None:
        _int({"gpus": config.gpus}, "gpus", file, "", low=1, high=MAX_STAND_IN_GPUS)
    _int({"stand_in_mem_mib": config.stand_in_mem_mib}, "stand_in_mem_mib", file, "", low=1)
    _int({"max_body_bytes": config.max_body_bytes}, "max_body_bytes", file, "", low=1024)
    _seconds({"grace_s": config.grace_s}, "grace_s", file, "")
    sample_s, history_s = config.dashboard_sample_s, config.dashboard_history_s
    _seconds({"dashboard_sample_s": sample_s}, "dashboard_sample_s", file, "")
    _seconds({"dashboard_history_s": history_s}, "dashboard_history_s", file, "")
    if not 0.1 <= sample_s <= history_s <= 7 * 86400:  # a sample more often than 10 a second is a busy loop
        raise ConfigFileError(
            "bad value",
            file=file,
            column="dashboard_sample_s",
            expected="0.1 <= dashboard_sample_s <= dashboard_history_s <= 604800 (a week)",
            got=(sample_s, history_s),
        )
    _seconds({"estimate_interval_s": config.estimate_interval_s}, "estimate_interval_s", file, "")
    for spec in config.ray_expect:
        parse_expected_node(spec, file)
    if config.ray_expect and config.ray is None:
        raise ConfigFileError(
            "ray_expect without ray", file=file, column="ray_expect", expected="ray set too", got=config.ray_expect
        )
    if config.ray is not None:
        _check_ray(config.ray, file)
        if config.gpus is not None:
            raise ConfigFileError(
                "gpus and ray together",
                file=file,
                column="gpus",
                expected="no gpus with ray: the Ray nodes' GPUs are the cluster (local:NxG declares stand-ins)",
                got=config.gpus,
            )
    if not config.tenants:
        raise ConfigFileError("no tenants", file=file, column="tenants", expected="at least one tenant")
    for i, t in enumerate(config.tenants):
        if not TENANT_NAME.match(t.name):
            raise ConfigFileError(
                "bad tenant name",
                file=file,
                column=f"tenants[{i}].name",
                expected="1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit",
                got=t.name,
            )
        if t.quota_gpus is not None:
            _int({"quota_gpus": t.quota_gpus}, "quota_gpus", file, f"tenants[{i}]", low=0)
        if t.token is not None:
            _check_token(t.token, file, f"tenants[{i}].token")
    if config.admin_token is not None:
        _check_token(config.admin_token, file, "admin_token")
    _check_config_values(
        {"tenants": config.tenants, "admin_token": config.admin_token},
        file,
    )
