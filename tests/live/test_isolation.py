"""One tenant's job against another tenant and the server (issue 22, items 2 and 3), with a real controller, agent
and processes on stand-in GPUs.

A job of tenant ``a`` tries every route a campaign against ``corral serve`` found: the tokens in its environment;
``admin.token``, the configuration, ``server.json`` and the store's database; ``b``'s log and checkpoint; ``b``'s
environment in ``/proc`` (and with it ``b``'s channel secret); the agent's channel as ``b``'s run, to receive its
directives and forge its events. The test runs it twice:

- without ``run_as``: every job runs as the server's Unix user. As ``docs/live.md`` says plainly, the file routes
  then *succeed* (the test asserts that they do, so that the documentation stays true), and a job that steals
  another's secret from ``/proc`` can speak for it; what holds is the environment (no tokens) and the channel
  against a process without the secret;
- with ``run_as`` (root only: the test creates the Unix users with ``useradd``): every route fails.

Then one job cannot make the controller drop other tenants' accepted jobs: a flood of malformed step reports while
another tenant submits 30 jobs, and a failure while handling one inbox item or one engine event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.core import contract
from corral.core.job import JobPhase, JobView
from corral.live.agent import JobReported
from corral.live.config import ServeConfig, TenantConfig, ensure_admin_token, load_config, write_server_file
from corral.live.controller import Controller
from corral.live.records import BadRequest, JobRecord, JobRequest, ProcessPhase

# -- the jobs (standard library only: with run_as they run under a Python the tenant's user can reach) ---------

# Tenant b's job: writes a checkpoint and a log line, holds its channel, and records every directive it gets.
VICTIM = r"""
import json, os, socket, time
ck = os.environ["CORRAL_CHECKPOINT_DIR"]
with open(os.path.join(ck, "ckpt"), "w") as f:
    f.write("b-ckpt-secret")
print("b-log-secret", flush=True)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["CORRAL_AGENT_SOCKET"])
hello = {"type": "hello", "job_id": os.environ["CORRAL_JOB_ID"], "run": int(os.environ["CORRAL_RUN"]),
         "pid": os.getpid(), "secret": os.environ["CORRAL_RUN_SECRET"]}
s.sendall(json.dumps(hello).encode() + b"\n")
for line in s.makefile("rb"):  # the controller answers every accepted hello with the job's limits
    with open(os.path.join(ck, "directives"), "a") as f:
        f.write(line.decode())
while True:
    time.sleep(0.1)
"""

# Tenant a's job: tries every route; prints what worked as one RESULT line (argv[1]: what to try, as JSON).
ATTACKER = r"""
import json, os, socket, sys
args = json.loads(sys.argv[1])
markers = args["markers"]
out = {"files": {}}
everything = "\0".join(f"{k}={v}" for k, v in os.environ.items())
out["env_markers"] = [m for m in markers if m in everything]
out["env_names"] = sorted(os.environ)
for name, path in args["files"].items():
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        out["files"][name] = {"read": True, "found": [m for m in markers if m in text]}
    except OSError as e:
        out["files"][name] = {"read": False, "error": type(e).__name__}
# b's secret from its processes' environment
stolen, readable, denied = None, 0, 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        denied += 1
        continue
    if ("CORRAL_JOB_ID=" + args["victim"]).encode() in environ:
        readable += 1
        for item in environ:
            if item.startswith(b"CORRAL_RUN_SECRET="):
                stolen = item.split(b"=", 1)[1].decode()
out["proc"] = {"victim_environs_read": readable, "stolen": stolen is not None}
# the agent's channel, as b's run
out["channel"] = {}
tries = {"none": "", "wrong": "0" * 64, "leaked": args["leaked"]}
if stolen is not None:
    tries["stolen"] = stolen
for name, secret in tries.items():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(args["socket"])
    except OSError as e:
        out["channel"][name] = {"connected": False, "error": type(e).__name__}
        continue
    hello = {"type": "hello", "job_id": args["victim"], "run": 1, "pid": os.getpid(), "secret": secret}
    forged = {"type": "checkpointed", "job_id": args["victim"], "run": 1, "step": 424242, "path": "/forged"}
    got, closed = b"", False
    try:
        s.sendall(json.dumps(hello).encode() + b"\n" + json.dumps(forged).encode() + b"\n")
        s.settimeout(1.5)
        while True:
            data = s.recv(4096)
            if not data:
                closed = True
                break
            got += data
    except socket.timeout:
        pass
    except OSError:
        closed = True
    s.close()
    received = [json.loads(x)["type"] for x in got.splitlines() if x.strip()]
    out["channel"][name] = {"connected": True, "closed": closed, "received": received}
# what a tenant's own job may do under run_as: its own checkpoint directory and its own log
try:
    with open(os.path.join(os.environ["CORRAL_CHECKPOINT_DIR"], "mine"), "w") as f:
        f.write("a's own")
    out["own_checkpoint"] = True
except OSError as e:
    out["own_checkpoint"] = type(e).__name__
try:
    with open(args["own_log"].replace("JOB", os.environ["CORRAL_JOB_ID"]), "rb") as f:
        out["own_log"] = b"corral: run 1 started" in f.read()
except OSError as e:
    out["own_log"] = type(e).__name__
print("RESULT " + json.dumps(out), flush=True)
"""


# -- helpers --------------------------------------------------------------------------------------------------
def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_phase(c: Controller, job_id: str, *phases: JobPhase, timeout_s: float = 30.0) -> JobRecord:
    wait_until(lambda: c.job(job_id).phase in phases, f"job {job_id} to be {phases}: {c.events(job_id)}", timeout_s)
    return c.job(job_id)


def shutdown(c: Controller) -> None:
    """Cancel whatever still runs (tests leave no processes behind), then stop."""
    for rec in c.jobs(phases=[JobPhase.RUNNING, JobPhase.PENDING]):
        with contextlib.suppress(BadRequest):
            c.cancel(rec.job_id)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: all(r.process.phase is ProcessPhase.NONE for r in c.jobs()), "processes to end", 15)
    c.stop()


def kill_runs_under(state_dir: Path) -> None:
    """Kill the process group of every run left running under ``state_dir`` (its shim's recorded pid)."""
    for record in state_dir.glob("runs/*/*/spawned"):
        with contextlib.suppress(OSError, ValueError):
            pid, ticks = (int(x) for x in record.read_text().split())
            with open(f"/proc/{pid}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[19]) != ticks:
                    continue  # the pid is another process's by now
            os.killpg(pid, signal.SIGKILL)


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o777


@dataclass
class Users:
    a: str
    b: str


def _useradd(name: str) -> None:
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def unix_users() -> Iterator[Users]:
    """Two fresh Unix users (root only), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("run_as needs root: the test creates Unix users and the server starts jobs as them")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    tag = secrets.token_hex(3)
    users = Users(f"crl-a-{tag}", f"crl-b-{tag}")
    made: list[str] = []
    try:
        for name in (users.a, users.b):
            _useradd(name)
            made.append(name)
        yield users
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def python_for(user: str | None, cwd: Path) -> str:
    """A Python the job's user can run (the test's own may sit in a directory only root can enter)."""
    candidates = [sys.executable, shutil.which("python3") or "", "/usr/bin/python3"]
    for python in filter(None, dict.fromkeys(candidates)):
        try:
            ok = subprocess.run(
                [python, "-c", "import json, socket"], user=user, cwd=cwd, capture_output=True, timeout=30
            ).returncode
        except OSError:
            continue
        if ok == 0:
            return python
    pytest.skip(f"no Python that user {user} may run (tried {candidates})")


@dataclass
class Server:
    controller: Controller
    config: ServeConfig
    config_path: Path
    base: Path
    python: str
    tokens: dict[str, str]


@contextlib.contextmanager
def serve(run_as: Users | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """``corral serve`` as its command does it: a configuration file (0600, one token literally, one through an
    environment variable), the admin token kept in the state directory, server.json, the controller."""
    base = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    os.chmod(base, 0o711)  # run_as users pass through to the state directory and use it as their cwd
    token_a, token_b = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    monkeypatch.setenv("CORRAL_TOKEN_A_TEST", token_a)
    lines = [
        "[server]",
        'policy = "fifo"',
        "gpus = 2",
        'state_dir = "state"',
        "grace_s = 2",
        "[[tenants]]",
        'name = "a"',
        'token_env = "CORRAL_TOKEN_A_TEST"',
        *([f'run_as = "{run_as.a}"'] if run_as else []),
        "[[tenants]]",
        'name = "b"',
        f'token = "{token_b}"',
        *([f'run_as = "{run_as.b}"'] if run_as else []),
    ]
    config_path = base / "corral.toml"
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    config = ensure_admin_token(load_config(config_path))
    write_server_file(config, "http://127.0.0.1:1", os.getpid())
    python = python_for(run_as.a if run_as else None, base)
    if run_as:
        assert python_for(run_as.b, base) == python
    controller = Controller.from_config(config)
    controller.start()
    assert config.admin_token is not None
    server = Server(
        controller, config, config_path, base, python, {"a": token_a, "b": token_b, "admin": config.admin_token}
    )
    try:
        yield server
    finally:
        shutdown(server.controller)  # (a test may have replaced it, as a restart does)
        kill_runs_under(config.state_dir)  # whatever a failed test left: a user with processes cannot be removed
        shutil.rmtree(base, ignore_errors=True)


def attack(server: Server, leak_secret: bool) -> tuple[dict[str, Any], str, str]:
    """Start b's job, then a's attacker; returns the attacker's findings and the two job ids."""
    c = server.controller
    sd = server.config.state_dir
    victim = c.submit(
        JobRequest(
            command=(server.python, "-c", VICTIM), tenant="b", cwd=str(server.base), env={"B_PRIVATE": "b-env-secret"}
        )
    ).job_id
    ckpt = sd / "tenants" / "b" / "checkpoints" / victim
    wait_until(lambda: (ckpt / "directives").exists(), "b's job to hold its channel (its first directive)")
    secret = (sd / "runs" / victim / "1" / "secret").read_text().strip()
    markers = [*server.tokens.values(), "b-env-secret", "b-log-secret", "b-ckpt-secret", secret]
    args = {
        "markers": markers,
        "victim": victim,
        "socket": str(c.agent.socket_path),  # type: ignore[attr-defined]
        # a secret leaked to a by some other way: with run_as the channel also checks the Unix user
        "leaked": secret if leak_secret else "",
        "own_log": str(sd / "tenants" / "a" / "logs" / "JOB.log"),
        "files": {
            "admin.token": str(sd / "admin.token"),
            "server.json": str(sd / "server.json"),
            "config": str(server.config_path),
            "store": str(sd / "corral.db"),
            "store-wal": str(sd / "corral.db-wal"),
            "b log": str(sd / "tenants" / "b" / "logs" / f"{victim}.log"),
            "b checkpoint": str(ckpt / "ckpt"),
            "b run record": str(sd / "runs" / victim / "1" / "secret"),
        },
    }
    attacker = c.submit(
        JobRequest(command=(server.python, "-c", ATTACKER, json.dumps(args)), tenant="a", cwd=str(server.base))
    ).job_id
    done = wait_phase(c, attacker, JobPhase.FINISHED, JobPhase.FAILED)
    text = c.log_path(attacker).read_text()
    assert done.phase is JobPhase.FINISHED, text
    result: dict[str, Any] = json.loads(next(x for x in text.splitlines() if x.startswith("RESULT "))[7:])
    return result, victim, secret


def forged_events(c: Controller, job_id: str) -> list[str]:
    return [e.detail for e in c.events(job_id) if "424242" in e.detail]


# -- item 2: without run_as ---------------------------------------------------------------------------------------
def test_without_run_as_only_the_environment_and_the_channel_secret_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    with serve(None, monkeypatch) as server:
        result, victim, secret = attack(server, leak_secret=True)
        c = server.controller

        # Holds: no token reaches a job; nothing but the allow-list, the user, the request and the contract.
        assert result["env_markers"] == []
        allowed = {*contract.PASSED_ENV, *contract.USER_ENV, *contract.ALL_ENV, "CUDA_VISIBLE_DEVICES"}
        assert {n for n in result["env_names"] if not n.startswith(contract.PASSED_ENV_PREFIXES)} <= allowed
        # Holds: a process without b's secret cannot speak for b's run.
        for name in ("none", "wrong"):
            assert result["channel"][name] == {"connected": True, "closed": True, "received": []}, name

        # Does not hold, as docs/live.md says: all jobs are the server's user and read its files and each other's.
        files = result["files"]
        assert files["admin.token"]["found"] == [server.tokens["admin"]]
        assert server.tokens["b"] in files["config"]["found"]
        store = set(files["store"].get("found", [])) | set(files["store-wal"].get("found", []))
        assert "b-env-secret" in store  # b's request, env included
        assert "b-log-secret" in files["b log"]["found"]
        assert files["b checkpoint"]["found"] == ["b-ckpt-secret"]
        assert files["b run record"]["found"] == [secret]
        # ... and another job's secret from /proc, with which a can speak for b and receive b's directives.
        assert result["proc"] == {"victim_environs_read": 2, "stolen": True}  # b's job and its shim
        assert result["channel"]["stolen"]["received"] == ["limits"]
        assert forged_events(c, victim)
        assert result["own_checkpoint"] is True and result["own_log"] is True
        assert c.job(victim).phase is JobPhase.RUNNING


# -- item 2: with run_as ------------------------------------------------------------------------------------------
def test_with_run_as_no_route_reaches_another_tenant_or_the_server(
    unix_users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pwd

    with serve(unix_users, monkeypatch) as server:
        result, victim, _ = attack(server, leak_secret=True)
        c = server.controller
        sd = server.config.state_dir
        uid_a, uid_b = pwd.getpwnam(unix_users.a).pw_uid, pwd.getpwnam(unix_users.b).pw_uid

        assert result["env_markers"] == []
        assert set(result["env_names"]) >= {"HOME", "USER", "LOGNAME"}
        for name, outcome in result["files"].items():
            assert outcome == {"read": False, "error": "PermissionError"} or (
                name == "store-wal" and outcome["read"] is False
            ), (name, outcome)
        assert result["proc"] == {"victim_environs_read": 0, "stolen": False}
        # the channel: no secret, a wrong one, even b's own secret (leaked) from a's Unix user: dropped at once
        assert set(result["channel"]) == {"none", "wrong", "leaked"}
        for name, outcome in result["channel"].items():
            assert outcome == {"connected": True, "closed": True, "received": []}, name
        assert forged_events(c, victim) == []
        # b still holds its channel: a directive reaches it
        assert c.agent.send(victim, 1, contract.SetBatchSize(77))
        wait_until(lambda: '"batch_size":77' in (sd / "tenants/b/checkpoints" / victim / "directives").read_text(), "b")
        # what a may do: its own checkpoint directory, its own log
        assert result["own_checkpoint"] is True and result["own_log"] is True

        # the files, as root sees them
        b_ckpt = sd / "tenants" / "b" / "checkpoints" / victim
        assert (os.lstat(b_ckpt).st_uid, mode(b_ckpt)) == (uid_b, 0o700)
        assert os.lstat(b_ckpt / "ckpt").st_uid == uid_b
        b_log = sd / "tenants" / "b" / "logs" / f"{victim}.log"
        assert (os.lstat(b_log).st_uid, mode(b_log)) == (uid_b, 0o600)
        a_jobs = [r.job_id for r in c.jobs(tenant="a")]
        assert os.lstat(sd / "tenants" / "a" / "checkpoints" / a_jobs[0]).st_uid == uid_a
        for path in (sd, sd / "tenants", sd / "tenants" / "b", sd / "tenants" / "b" / "logs"):
            assert (os.lstat(path).st_uid, mode(path)) == (0, 0o711), path
        for path in (sd / "runs", sd / "runs" / victim, sd / "runs" / victim / "1"):
            assert (os.lstat(path).st_uid, mode(path)) == (0, 0o700), path
        for name in ("corral.db", "admin.token", "server.json"):
            assert (os.lstat(sd / name).st_uid, mode(sd / name)) == (0, 0o600), name
        for record in (sd / "runs" / victim / "1").iterdir():
            assert (record.stat().st_uid, mode(record)) == (0, 0o600), record
        assert mode(Path(str(c.agent.socket_path))) == 0o666  # type: ignore[attr-defined]
        # the job's process really is b's user
        pid = int((sd / "runs" / victim / "1" / "child").read_text())
        assert os.stat(f"/proc/{pid}").st_uid == uid_b


def test_run_as_survives_a_restart(unix_users: Users, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run_as job reattached by a new controller keeps its channel: its secret comes back from the run's record,
    the directories are opened again for its user, and its reconnection is accepted."""
    with serve(unix_users, monkeypatch) as server:
        c = server.controller
        sd = server.config.state_dir
        job = c.submit(JobRequest(command=(server.python, "-c", RECONNECTING), tenant="b", cwd=str(server.base))).job_id
        ckpt = sd / "tenants" / "b" / "checkpoints" / job
        wait_until(lambda: (ckpt / "connections").exists(), "the job's first connection")
        c.stop()
        assert mode(sd) == 0o711
        again = Controller.from_config(server.config)
        server.controller = again
        again.start()
        assert mode(sd) == 0o711  # tightened at start, opened again for the adopted run_as run
        wait_until(lambda: (ckpt / "connections").read_text().count("limits") >= 2, "its reconnection accepted")
        assert again.job(job).phase is JobPhase.RUNNING
        assert again.job(job).process.run == 1


# Reconnects whenever the agent goes away; records each directive line it gets.
RECONNECTING = r"""
import json, os, socket, time
ck = os.environ["CORRAL_CHECKPOINT_DIR"]
hello = {"type": "hello", "job_id": os.environ["CORRAL_JOB_ID"], "run": int(os.environ["CORRAL_RUN"]),
         "pid": os.getpid(), "secret": os.environ["CORRAL_RUN_SECRET"]}
while True:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["CORRAL_AGENT_SOCKET"])
        s.sendall(json.dumps(hello).encode() + b"\n")
        for line in s.makefile("rb"):
            with open(os.path.join(ck, "connections"), "a") as f:
                f.write(line.decode())
    except OSError:
        pass
    time.sleep(0.1)
"""


def test_run_as_is_checked_where_it_is_configured(unix_users: Users, tmp_path: Path) -> None:
    from corral.live.config import ConfigFileError

    def config(*tenants: TenantConfig) -> ServeConfig:
        return ServeConfig(state_dir=tmp_path, tenants=tenants, gpus=1)

    config(TenantConfig("a", run_as=unix_users.a), TenantConfig("b", run_as=unix_users.b))
    cases: list[tuple[tuple[TenantConfig, ...], str]] = [
        ((TenantConfig("a", run_as="no-such-user-corral"),), "no Unix user 'no-such-user-corral'"),
        ((TenantConfig("a", run_as="root"),), "must not run as root"),
        ((TenantConfig("a", run_as=unix_users.a), TenantConfig("b", run_as=unix_users.a)), "the same user as"),
        ((TenantConfig("a", run_as=unix_users.a), TenantConfig("b")), "would run this tenant's jobs as root"),
    ]
    for tenants, words in cases:
        with pytest.raises(ConfigFileError, match=words) as caught:
            config(*tenants)
        assert caught.value.column is not None and caught.value.column.endswith(".run_as")


def test_run_as_needs_a_root_server(unix_users: Users) -> None:
    """The same check from a server that is not root (run as one of the users, with corral's own sources)."""
    import mypy_extensions

    import corral

    # corral's sources, and the one dependency that importing its configuration needs (mypyc_attr, in the records)
    src = os.pathsep.join(str(Path(m.__file__).resolve().parents[i]) for m, i in ((corral, 1), (mypy_extensions, 0)))
    python = python_for(unix_users.a, Path("/"))
    check = (
        "from pathlib import Path\n"
        "from corral.live.config import ServeConfig, TenantConfig\n"
        f"ServeConfig(state_dir=Path('/nonexistent'), gpus=1, tenants=(TenantConfig('a', run_as={unix_users.b!r}),))\n"
    )
    probe = subprocess.run(
        [python, "-c", "import corral.live.config"], user=unix_users.a, env={"PYTHONPATH": src}, capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"user {unix_users.a} cannot import corral from {src}: {probe.stderr.decode()[-200:]}")
    run = subprocess.run(
        [python, "-c", check], user=unix_users.a, env={"PYTHONPATH": src}, capture_output=True, cwd="/", text=True
    )
    assert run.returncode != 0
    assert "tenants[0].run_as: corral serve runs as uid" in run.stderr and "not root" in run.stderr, run.stderr


# -- item 3: one job cannot make the controller drop other tenants' jobs -------------------------------------------

# Floods the channel with malformed step reports for argv[1] seconds (reconnecting when dropped), then idles.
FLOODER = r"""
import json, os, socket, sys, time
job, run = os.environ["CORRAL_JOB_ID"], int(os.environ["CORRAL_RUN"])
hello = {"type": "hello", "job_id": job, "run": run, "pid": os.getpid(), "secret": os.environ["CORRAL_RUN_SECRET"]}
bad = {"type": "step", "job_id": job, "run": run, "step": "many", "steps": 1, "step_time_s": "slow",
       "busy_s": [], "mem_peak_mib": True}
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["CORRAL_AGENT_SOCKET"])
        s.sendall(json.dumps(hello).encode() + b"\n")
        while time.monotonic() < end:
            s.sendall(json.dumps(bad).encode() + b"\n")
            time.sleep(0.0005)
    except OSError:
        time.sleep(0.01)
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    config = ServeConfig(
        state_dir=tmp_path / "state",
        gpus=2,
        tenants=(TenantConfig("a"), TenantConfig("b")),
        grace_s=1.0,
        policy="fifo",
    )
    c = Controller.from_config(config)
    c.start()
    yield c
    shutdown(c)


def request(tenant: str, *argv: str) -> JobRequest:
    return JobRequest(command=(sys.executable, *argv), tenant=tenant, cwd=os.getcwd())


def test_a_flood_of_bad_step_reports_does_not_lose_another_tenants_jobs(controller: Controller) -> None:
    c = controller
    flood = c.submit(request("a", "-c", FLOODER, "4")).job_id
    wait_phase(c, flood, JobPhase.RUNNING)
    wait_until(lambda: c.agent.bad_messages(flood, 1) > 0, "the flood to start")  # type: ignore[attr-defined]
    accepted = [c.submit(request("b", "-c", "pass")).job_id for _ in range(30)]
    for job_id in accepted:
        assert wait_phase(c, job_id, JobPhase.FINISHED).process.exit_code == 0
    assert c.job(flood).phase is JobPhase.RUNNING  # cut off from the channel, not killed
    assert c.agent.bad_messages(flood, 1) == contract.MAX_BAD_MESSAGES + 1  # type: ignore[attr-defined]
    assert c.failed_items == 0  # nothing bad got as far as the controller
    assert c.job(flood).telemetry is None


def test_a_failing_inbox_item_does_not_take_the_turns_other_items(
    controller: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    """A report that raises in the controller (a bug: the agent's checks let nothing like it through, so it is
    handed to the controller directly) arrives in the same turn as other tenants' submissions: those all run, and
    the failure is logged with its traceback and counted."""
    c = controller
    caplog.set_level(logging.ERROR, logger="corral.live.controller")
    victim = c.submit(request("a", "-c", "import time; time.sleep(60)")).job_id
    wait_phase(c, victim, JobPhase.RUNNING)
    wait_until(lambda: c.job(victim).process.phase is ProcessPhase.RUNNING, "its process")
    broken = contract.StepReport(victim, 1, 1, 1, "slow", [], True)  # type: ignore[arg-type]
    blocker = threading.Thread(target=c.call, args=(lambda: time.sleep(0.5),))
    blocker.start()  # the loop is busy: what comes now is taken in one turn, the broken report first
    time.sleep(0.1)
    c.deliver(JobReported(victim, 1, broken))
    accepted = [c.submit(request("b", "-c", "pass")).job_id for _ in range(10)]
    blocker.join()
    for job_id in accepted:
        assert wait_phase(c, job_id, JobPhase.FINISHED).process.exit_code == 0
    assert c.failed_items == 1
    failures = [r for r in caplog.records if "item failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert c.job(victim).phase is JobPhase.RUNNING


def test_a_submission_the_engine_cannot_take_ends_rejected_with_a_reason(
    controller: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine raises while taking one submission (a bug, simulated in the policy's queue key): that job ends
    REJECTED with the reason, durably, instead of staying pending unseen; the others of the turn run."""
    c = controller
    caplog.set_level(logging.ERROR, logger="corral.live.controller")
    state = c.state
    key = state._queue_key

    def buggy_key(job: JobView) -> tuple[Any, ...]:
        if job.spec.job_id == doomed[0]:
            raise ValueError("a bug in the queue key")
        return key(job)

    doomed: list[str] = []
    blocker = threading.Thread(target=c.call, args=(lambda: time.sleep(0.5),))
    blocker.start()
    time.sleep(0.1)
    others = [c.submit(request("b", "-c", "pass")).job_id for _ in range(3)]
    doomed.append(c.submit(request("a", "-c", "pass")).job_id)
    state._queue_key = buggy_key
    others += [c.submit(request("b", "-c", "pass")).job_id for _ in range(3)]
    blocker.join()
    record = wait_phase(c, doomed[0], JobPhase.REJECTED)
    assert record.status.reason is not None and "failed to take this job" in record.status.reason
    for job_id in others:
        assert wait_phase(c, job_id, JobPhase.FINISHED).process.exit_code == 0
    assert c.failed_items >= 1
    assert any("engine event failed" in r.getMessage() and r.exc_info for r in caplog.records)
    state._queue_key = key
