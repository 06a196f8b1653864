"""The live commands against a real ``corral serve`` subprocess (two stand-in GPUs, two tenants): submit, jobs
(a page at a time), job, logs (and ``-f``), cancel, cluster, tenants, and the one-line errors; user text shown
with its control characters made visible; ``serve`` itself: its banner, its files, a clean stop on a signal, and
its refusals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from rich.console import Console

import corral.cli.live as live_cli
from corral.cli.live import visible
from corral.cli.main import cli
from live_server import Server, free_port, start_server, stop_server

ALICE = "alice-cli-token-0123456789"
BOB = "bob-cli-token-0123456789ab"
PY = sys.executable
CONFIG = f"""
[server]
policy = "fifo"
grace_s = 2

[[tenants]]
name = "alice"
quota_gpus = 1
token = "{ALICE}"

[[tenants]]
name = "bob"
quota_gpus = 1
token = "{BOB}"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("srv")
    (base / "corral.toml").write_text(CONFIG)
    srv = start_server(base / "st", "--gpus", "2", "--config", str(base / "corral.toml"))
    try:
        yield srv
    finally:
        # Cancel what still runs (stopping the server leaves job processes running, by design).
        token = (srv.state_dir / "admin.token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        try:
            active = httpx.get(f"{srv.url}/v1/jobs", params={"phase": "pending,running"}, headers=headers).json()
            for job in active["jobs"]:
                httpx.post(f"{srv.url}/v1/jobs/{job['job_id']}/cancel", headers=headers)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                jobs = httpx.get(f"{srv.url}/v1/jobs", headers=headers).json()["jobs"]
                if all(j["process"]["phase"] == "none" for j in jobs):
                    break
                time.sleep(0.1)
        finally:
            stop_server(srv)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tables are cut to 80 columns when the output is not a terminal; tests read them whole.
    monkeypatch.setattr(live_cli, "console", Console(width=250))


def run(server: Server | None, *args: str, token: str | None = None, state_dir: Path | None = None) -> tuple[int, str]:
    env = {"CORRAL_URL": None, "CORRAL_TOKEN": token, "CORRAL_STATE_DIR": None}
    if server is not None or state_dir is not None:
        env["CORRAL_STATE_DIR"] = str(state_dir or (server.state_dir if server else ""))
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def wait_phase(server: Server, job_id: str, *phases: str) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while True:
        code, out = run(server, "job", job_id, "--json")
        assert code == 0, out
        job = json.loads(out)["job"]
        if job["phase"] in phases and job["process"]["phase"] in ("none", "running"):
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


# -- serve ------------------------------------------------------------------------------------------------------
def test_serve_says_where_it_is_and_what_it_runs(server: Server) -> None:
    assert server.url in server.banner
    assert "2 STAND-IN GPUs" in server.banner
    assert "policy fifo" in server.banner
    assert str(server.state_dir / "admin.token") in server.banner
    info = json.loads((server.state_dir / "server.json").read_text())
    assert info == {"url": server.url, "pid": server.process.pid}


def test_serve_stops_cleanly_on_a_signal(tmp_path: Path) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        srv = start_server(tmp_path / "st", "--gpus", "1")
        code, err = stop_server(srv, sig)
        assert code == 0, err
        assert "Traceback" not in err
        assert not (tmp_path / "st" / "server.json").exists()
    # The admin token is kept across starts.
    assert len((tmp_path / "st" / "admin.token").read_text().strip()) >= 32


def test_serve_refusals(tmp_path: Path, server: Server) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "corral.cli.main", "serve", *args], capture_output=True, text=True, timeout=60)

    busy = server.url.rsplit(":", 1)[1]
    r = serve("--gpus", "1", "--state-dir", str(tmp_path / "a"), "--port", busy)
    assert r.returncode == 2 and "error: cannot listen on 127.0.0.1:" in r.stderr and "in use" in r.stderr
    r = serve("--gpus", "1", "--state-dir", str(server.state_dir), "--port", str(free_port()))
    assert r.returncode == 2 and "another corral server uses the state directory" in r.stderr
    (tmp_path / "open.toml").write_text('[server]\nhost = "0.0.0.0"\n')
    r = serve("--gpus", "1", "--state-dir", str(tmp_path / "b"), "--config", str(tmp_path / "open.toml"))
    assert r.returncode == 2 and "pass --host 0.0.0.0 to confirm" in r.stderr
    r = serve("--gpus", "0", "--state-dir", str(tmp_path / "c"))
    assert r.returncode == 2 and "--gpus" in r.stderr
    r = serve("--policy", "nosuch", "--gpus", "1", "--state-dir", str(tmp_path / "d"))
    assert r.returncode == 2 and "unknown policy 'nosuch'" in r.stderr
    # A policy that needs job durations would start and reject every job: refused before anything starts.
    r = serve("--policy", "sjf", "--gpus", "1", "--state-dir", str(tmp_path / "e"))
    assert r.returncode == 2 and "error: <command line>: --policy: sjf orders jobs by their duration" in r.stderr
    assert "tiresias" in r.stderr and not (tmp_path / "e").exists()
    for stream in (r.stdout, r.stderr):
        assert "Traceback" not in stream


# -- a job's life -------------------------------------------------------------------------------------------------
def test_job_shows_a_running_jobs_slowdown_against_its_step_time_alone(server: Server) -> None:
    steps = (
        "import time, corral.job\n"
        "with corral.job.Job(verbose=False) as job:\n"
        "    while True:\n"
        "        with job.step():\n"
        "            time.sleep(0.02)\n"
    )
    code, out = run(server, "submit", "--name", "stepper", "--", PY, "-c", steps, token=ALICE)
    assert code == 0, out
    job_id = out.splitlines()[0]
    try:
        deadline = time.monotonic() + 40
        while True:  # the controller learns its step time alone from a few reports made alone
            code, out = run(server, "job", job_id, "--json", token=ALICE)
            tel = json.loads(out)["job"]["telemetry"]
            if tel is not None and tel["slowdown"] is not None:
                break
            assert time.monotonic() < deadline, tel
            time.sleep(0.2)
        code, out = run(server, "job", job_id, token=ALICE)
        assert code == 0
        line = next(line for line in out.splitlines() if "slowdown" in line)
        assert re.search(r"\d\.\d\dx its step time alone \(\d+\.\d ms, median of \d+ reports\)", line), line
    finally:
        run(server, "cancel", job_id, token=ALICE)
        wait_phase(server, job_id, "cancelled")


def test_submit_jobs_job_logs(server: Server) -> None:
    code, out = run(server, "submit", "--name", "greet", "--env", "WHO=world", "--", PY, "-c",
                    "import os; print('hello', os.environ['WHO'])", token=ALICE)  # fmt: skip
    assert code == 0, out
    job_id = out.splitlines()[0]
    assert re.fullmatch(r"[a-z2-9]{8}", job_id)  # opaque, not a global counter (it used to be: isdigit())
    wait_phase(server, job_id, "finished")
    code, out = run(server, "logs", job_id, token=ALICE)
    assert code == 0 and "hello world" in out
    code, out = run(server, "jobs", "--all", token=ALICE)
    assert code == 0 and "greet" in out and "finished" in out and "alice" in out
    code, out = run(server, "jobs", token=ALICE)  # active jobs only
    assert code == 0 and "greet" not in out
    code, out = run(server, "job", job_id, token=ALICE)
    assert code == 0
    for words in ("finished", "alice", "guaranteed", "WHO=world", "submitted", "exit code 0"):
        assert words in out, out
    # Bob does not see it; the admin (the state dir's token) does.
    code, out = run(server, "job", job_id, token=BOB)
    assert code == 2 and f"error: no job '{job_id}'" in out
    code, out = run(server, "jobs", "--all", "--json")  # the server's answer: a page
    page = json.loads(out)
    assert code == 0 and job_id in [j["job_id"] for j in page["jobs"]] and page["total"] >= 1


def test_submit_from_a_job_file(server: Server, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "job.toml").write_text(
        f'command = ["{PY}", "-c", "import os; print(os.getcwd())"]\nname = "from-file"\ncwd = "work"\n'
        'tenant = "bob"\nenv = {X = "1"}\n'
    )
    code, out = run(server, "submit", "--file", str(tmp_path / "job.toml"), "--json")
    assert code == 0, out
    job = json.loads(out)
    assert job["name"] == "from-file" and job["tenant"] == "bob" and job["env"] == {"X": "1"}
    assert job["cwd"] == str((tmp_path / "work").resolve())
    wait_phase(server, job["job_id"], "finished")
    code, out = run(server, "logs", job["job_id"])
    assert str((tmp_path / "work").resolve()) in out


def test_logs_follow_until_the_job_ends(server: Server) -> None:
    script = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\nprint('done')"
    code, out = run(server, "submit", "--", PY, "-c", script, token=BOB)
    assert code == 0, out
    job_id = out.splitlines()[0]
    code, out = run(server, "logs", "-f", job_id, token=BOB)
    assert code == 0, out
    assert "tick 0" in out and "tick 2" in out and "done" in out


def test_cancel_a_running_job(server: Server) -> None:
    code, out = run(server, "submit", "--", PY, "-c", "import time; time.sleep(60)", token=ALICE)
    job_id = out.splitlines()[0]
    wait_phase(server, job_id, "running")
    code, out = run(server, "cluster", token=ALICE)
    assert code == 0 and f"{job_id} (alice, 1)" in out
    code, out = run(server, "cluster", token=BOB)  # another tenant's job: that its GPU is busy, nothing more
    assert code == 0 and "busy (another tenant's)" in out and job_id not in out and "alice" not in out
    code, out = run(server, "cancel", job_id, token=BOB)
    assert code == 2 and f"error: no job '{job_id}'" in out
    code, out = run(server, "cancel", job_id, token=ALICE)
    assert code == 0 and f"job {job_id}: cancelled" in out
    wait_phase(server, job_id, "cancelled")
    code, out = run(server, "cancel", job_id, token=ALICE)
    assert code == 2 and "already ended (cancelled)" in out


def test_cluster_and_tenants(server: Server) -> None:
    code, out = run(server, "cluster")
    assert code == 0, out
    assert "STAND-IN GPUs" in out and "stand-in" in out and "policy fifo" in out
    assert "alice" in out and "bob" in out  # the tenants' table
    code, out = run(server, "cluster", "--json")
    snap = json.loads(out)
    assert snap["cluster"]["num_gpus"] == 2 and {t["name"] for t in snap["tenants"]} == {"alice", "bob"}
    code, out = run(server, "tenants", token=BOB)
    assert code == 0 and "bob" in out and "alice" not in out
    code, out = run(server, "tenants", "--json")
    assert [t["quota_gpus"] for t in json.loads(out)] == [1, 1]
    code, out = run(None, "cluster", "2x4")  # with a SPEC: the spec, as before
    assert code == 0 and "cluster" in out


# -- errors ---------------------------------------------------------------------------------------------------------
def test_errors_are_one_line(server: Server, tmp_path: Path) -> None:
    cases = [
        (run(server, "submit", "--gpus", "5", "--opportunistic", "--", "true", token=ALICE), "this cluster has 2"),
        (run(server, "submit", "--gpus", "2", "--", "true", token=ALICE), "quota of 1 GPU;"),
        (run(server, "submit", "--tenant", "bob", "--", "true", token=ALICE), "cannot submit for 'bob'"),
        (run(server, "submit", "--", "true"), "tenant is required with the admin token"),
        (run(server, "submit", "--tenant", "carol", "--", "true"), "unknown tenant 'carol'"),
        (run(server, "submit", token=ALICE), "no command"),
        (run(server, "job", "999"), "no job '999'"),
        (run(server, "logs", "999"), "no job '999'"),
        (run(server, "jobs", "--phase", "sleeping"), "unknown phase 'sleeping'"),
        (run(server, "jobs", token="not-a-token-at-all"), "unknown token"),
        (run(None, "jobs", state_dir=tmp_path / "none"), "no corral server found"),
        (run(None, "jobs", "--url", f"http://127.0.0.1:{free_port()}", "--token", ALICE), "no corral server at"),
    ]
    (tmp_path / "bad.toml").write_text('command = ["true"]\ngpus = 2\n')
    cases.append((run(server, "submit", "--file", str(tmp_path / "bad.toml")), "bad.toml: gpus: unknown key"))
    for (code, out), words in cases:
        assert code == 2, out
        assert out.startswith("error: ") and words in out, out
        assert len(out.strip().splitlines()) == 1, out
        assert "Traceback" not in out
    code, out = run(server, "submit", "--env", "NOEQUALS", "--", "true", token=ALICE)
    assert code == 2 and "KEY=VALUE" in out


# -- user text on the terminal --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name", "plain name"),
        ("é € 😀 漢字 a\u00a0b c\u3000d", "é € 😀 漢字 a\u00a0b c\u3000d"),  # every script's letters and spaces
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),  # colours
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # the terminal's title
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x9b2J\x7f\x00", "\\x9b2J\\x7f\\x00"),  # C1 CSI, DEL, NUL
        ("abc\u202edcba\u2066x\u2069", "abc\\u202edcba\\u2066x\\u2069"),  # bidirectional overrides
        ("zero\u200bwidth\u2028line", "zero\\u200bwidth\\u2028line"),
        ("\U000e0041tag", "\\U000e0041tag"),  # a tag character (format, outside the BMP)
    ],
)
def test_control_characters_are_made_visible(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_user_text_is_shown_not_obeyed(server: Server) -> None:
    name = "\x1b[2J\x1b]0;pwned\x07evil\u202eeman"
    code, out = run(server, "submit", "--name", name, "--env", "X=\x1b[31mred", "--", PY, "-c",
                    "print('\\x1b[1mbold from the job')", "\x1b[5m", token=BOB)  # fmt: skip
    assert code == 0, out
    job_id = out.splitlines()[0]
    wait_phase(server, job_id, "finished")
    for args in (("jobs", "--all"), ("job", job_id)):
        code, out = run(server, *args, token=BOB)
        assert code == 0, out
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, repr(out)
        assert "\\x1b[2J\\x1b]0;pwned\\x07evil\\u202eeman" in out, out
    code, out = run(server, "job", job_id, token=BOB)
    assert "X=\\x1b[31mred" in out and "\\x1b[5m" in out
    # The log is the job's own output, printed as it wrote it (docs/live.md says so).
    code, out = run(server, "logs", job_id, token=BOB)
    assert code == 0 and "\x1b[1mbold from the job" in out


def test_jobs_shows_a_page_and_the_way_to_the_next(server: Server) -> None:
    ids = []
    for i in range(3):
        code, out = run(server, "submit", "--name", f"paged-{i}", "--", PY, "-c", "pass", token=ALICE)
        assert code == 0, out
        ids.append(out.splitlines()[0])
    for job_id in ids:
        wait_phase(server, job_id, "finished")
    code, out = run(server, "jobs", "--all", "--json", token=ALICE)
    every = [j["job_id"] for j in json.loads(out)["jobs"]]
    assert every[-3:] == ids

    code, out = run(server, "jobs", "--all", "--limit", "1", token=ALICE)
    assert code == 0, out
    assert f"all jobs: 1 of {len(every)}" in out and every[0] in out
    cursor = re.search(r"--cursor (\S+)", out)
    assert cursor is not None, out
    code, out = run(server, "jobs", "--all", "--limit", "1", "--cursor", cursor[1], token=ALICE)
    assert code == 0 and every[1] in out and every[0] not in out, out

    code, out = run(server, "jobs", "--all", "--newest", "--limit", "2", "--json", token=ALICE)
    page = json.loads(out)
    assert [j["job_id"] for j in page["jobs"]] == [ids[2], ids[1]] and page["total"] == len(every)
    code, out = run(server, "jobs", "--all", "--limit", str(len(every)), token=ALICE)
    assert re.search(rf"all jobs: {len(every)}(?! of)\b", out), out
    assert "--cursor" not in out
    code, out = run(server, "jobs", "--cursor", "not-a-cursor", token=ALICE)
    assert code == 2 and "error: query parameter 'cursor': not a cursor this server gave" in out


def test_corral_job_names_the_node_and_gpus_of_each_rank() -> None:
    from corral.cli.live import _ranks

    gpus = [{"node": n} for n in ("node0", "node0", "node1", "node1", "node2", "node2")]
    snap: Any = {"nodes": [{"name": f"node{i}"} for i in range(3)], "gpus": gpus}
    job: Any = {"placement": {"gpus": [4, 5, 2, 3]}}
    assert _ranks(job, snap) == "rank 0: node1 GPUs 2,3; rank 1: node2 GPUs 4,5"
    assert _ranks({"placement": None}, snap) == ""  # type: ignore[arg-type]
    assert _ranks(job, {"nodes": [{"name": "local"}], "gpus": gpus}) == ""  # type: ignore[arg-type]


# -- waiting for a job --------------------------------------------------------------------------------------------
def test_wait_exits_with_the_jobs_outcome(server: Server) -> None:
    code, out = run(server, "submit", "--", PY, "-c", "print('fine')", token=ALICE)
    assert code == 0, out
    fine = out.splitlines()[0]
    code, out = run(server, "wait", fine, token=ALICE)
    assert code == 0, out
    assert f"job {fine} finished" in out

    script = "import sys\nfor i in range(30):\n    print('line', i)\nprint('about to fail', flush=True)\nsys.exit(3)"
    code, out = run(server, "submit", "--", PY, "-c", script, token=ALICE)
    bad = out.splitlines()[0]
    code, out = run(server, "wait", bad, token=ALICE)
    assert code == 1, out
    assert f"job {bad} failed: exited with code 3" in out
    # The last lines of its log, as `corral logs` shows them: the end only.
    assert "about to fail" in out and "line 29" in out and "line 5\n" not in out, out
    code, out = run(server, "wait", bad, "--json", token=ALICE)  # the job as it ended, and the same status
    assert code == 1 and json.loads(out)["phase"] == "failed"
    code, out = run(server, "wait", bad, token=BOB)  # another tenant's job: an error, as anywhere else
    assert code == 2 and f"error: no job '{bad}'" in out


def test_submit_wait(server: Server) -> None:
    code, out = run(server, "submit", "--wait", "--", PY, "-c", "print('quick')", token=BOB)
    assert code == 0, out
    job_id = out.splitlines()[0]
    assert re.fullmatch(r"[a-z2-9]{8}", job_id) and f"job {job_id} finished" in out
    code, out = run(server, "submit", "--wait", "--json", "--", PY, "-c", "raise SystemExit(3)", token=BOB)
    assert code == 1, out
    job = json.loads(out)  # one document: the job as it ended
    assert job["phase"] == "failed" and job["process"]["exit_code"] == 3


def test_wait_gives_up_at_its_timeout_and_leaves_the_job(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = run(server, "submit", "--", PY, "-c", "import time; time.sleep(60)", token=BOB)
    job_id = out.splitlines()[0]
    started = time.monotonic()
    code, out = run(server, "wait", "--timeout", "0.5", job_id, token=BOB)
    assert code == 124, out
    assert time.monotonic() - started < 10
    assert re.search(rf"job {job_id} is still (pending|running)\b.* after 0.5 s", out), out
    # Ctrl-C: 130, and the job goes on.
    from corral.live.client import Client

    def interrupted(self: Client, job_id: str, *, timeout_s: float | None = None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "wait", interrupted)
    code, out = run(server, "wait", job_id, token=BOB)
    assert code == 130 and f"stopped waiting; job {job_id} goes on" in out, out
    monkeypatch.undo()
    assert wait_phase(server, job_id, "running")["phase"] == "running"
    code, out = run(server, "cancel", job_id, token=BOB)
    assert code == 0, out
    code, out = run(server, "wait", job_id, token=BOB)
    assert code == 1 and f"job {job_id} cancelled" in out, out


# -- how long a pending job has waited ----------------------------------------------------------------------------
def _cell(out: str, column: str, row: str) -> str:
    """The cell of a rich table in ``out`` at ``column`` (a header) and the row that holds ``row``."""
    lines = out.splitlines()
    header = next(line for line in lines if f" {column} " in line)
    names = [c.strip() for c in re.split(r"[┃│]", header)]
    found = next(line for line in lines if row in line)
    return [c.strip() for c in re.split(r"[┃│]", found)][names.index(column)]


def test_a_pending_job_shows_how_long_it_has_waited(server: Server) -> None:
    # alice's quota is 1 GPU: her second job waits while the first runs.
    code, out = run(server, "submit", "--", PY, "-c", "import time; time.sleep(60)", token=ALICE)
    blocker = out.splitlines()[0]
    wait_phase(server, blocker, "running")
    code, out = run(server, "submit", "--", PY, "-c", "print('my turn')", token=ALICE)
    waiting = out.splitlines()[0]
    time.sleep(2.2)
    code, out = run(server, "job", waiting, "--json", token=ALICE)
    job = json.loads(out)["job"]
    assert job["phase"] == "pending" and job["queued_s"] == 0 and job["queued_since_s"] is not None
    code, out = run(server, "job", waiting, token=ALICE)
    assert code == 0, out
    shown = re.search(r"queued\W+(\d+)s", out)
    assert shown is not None and int(shown[1]) >= 2, out
    code, out = run(server, "jobs", token=ALICE)
    assert code == 0, out
    assert int(_cell(out, "queued", waiting).removesuffix("s")) >= 2, out
    assert _cell(out, "queued", blocker) in ("0s", "1s"), out  # it started at once: its wait is over
    # Once it runs and ends, it keeps the time it waited, no more.
    run(server, "cancel", blocker, token=ALICE)
    ended = wait_phase(server, waiting, "finished")
    assert ended["queued_since_s"] is None and 2 <= ended["queued_s"] < 60
    code, out = run(server, "job", waiting, token=ALICE)
    assert re.search(rf"queued\W+{round(ended['queued_s'])}s", out), out


def test_serve_prints_a_line_per_job_event_unless_quiet(tmp_path: Path) -> None:
    loud = start_server(tmp_path / "loud", "--gpus", "1")
    seen: list[str] = []
    stdout = loud.process.stdout
    assert stdout is not None
    threading.Thread(target=lambda: seen.extend(iter(stdout.readline, "")), daemon=True).start()
    try:
        code, out = run(loud, "submit", "--", PY, "-c", "pass")
        assert code == 0, out
        job_id = out.splitlines()[0]
        deadline = time.monotonic() + 30
        while not any(f"{job_id} finished" in line for line in seen):
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        kinds = [line.split()[2].rstrip(":") for line in seen if job_id in line]
        assert kinds[:2] == ["submitted", "launched"] and kinds[-1] == "finished", seen
        assert re.match(r"\d\d:\d\d:\d\d ", seen[0])
    finally:
        stop_server(loud)
    quiet = start_server(tmp_path / "quiet", "--gpus", "1", "--quiet")
    try:
        code, out = run(quiet, "submit", "--wait", "--", PY, "-c", "pass")
        assert code == 0, out
    finally:
        stop_server(quiet)
    assert quiet.process.stdout is not None
    assert quiet.process.stdout.read() == ""  # the banner was read already; nothing else was printed


def test_events_lists_and_follows_what_a_token_may_see(server: Server) -> None:
    code, out = run(server, "submit", "--wait", "--", PY, "-c", "pass", token=ALICE)
    assert code == 0, out
    mine = out.splitlines()[0]
    code, out = run(server, "submit", "--wait", "--", PY, "-c", "pass", token=BOB)
    assert code == 0, out
    theirs = out.splitlines()[0]
    code, out = run(server, "events", "--all", token=ALICE)
    assert code == 0, out
    assert f"{mine} submitted" in out and f"{mine} finished" in out and theirs not in out
    code, admin = run(server, "events", "--all")
    assert code == 0 and mine in admin and theirs in admin
    code, out = run(server, "events", "--last", "1", token=BOB)
    assert code == 0 and out.count("\n") == 1 and f"{theirs} finished" in out, out

    # -f: what happens next, as it happens, with Bob's token.
    env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_TOKEN": BOB}
    follower = subprocess.Popen(
        [PY, "-m", "corral.cli.main", "events", "-f", "--last", "0"], env=env, stdout=subprocess.PIPE, text=True
    )
    seen: list[str] = []
    assert follower.stdout is not None
    stdout = follower.stdout
    threading.Thread(target=lambda: seen.extend(iter(stdout.readline, "")), daemon=True).start()
    try:
        time.sleep(1.0)  # it has found the end of the feed
        code, out = run(server, "submit", "--", PY, "-c", "pass", token=BOB)
        later = out.splitlines()[0]
        deadline = time.monotonic() + 30
        while not any(f"{later} finished" in line for line in seen):
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        assert not any(theirs in line for line in seen)  # only what came after it started
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 130


# -- a first hour without surprises (issue 18) --------------------------------------------------------------------
def _submit(server: Server, *args: str, token: str | None = None) -> Any:
    """``corral submit ARGS`` with stdout and stderr apart (``run`` gives them mixed)."""
    env = {"CORRAL_URL": None, "CORRAL_TOKEN": token, "CORRAL_STATE_DIR": str(server.state_dir)}
    return CliRunner().invoke(cli, ["submit", *args], env=env)


def test_submit_says_when_the_job_fails_at_once(server: Server) -> None:
    script = "import sys\nprint('no such file: data.csv', flush=True)\nsys.exit(3)"
    result = _submit(server, "--", PY, "-c", script, token=ALICE)
    assert result.exit_code == 1, result.output
    job_id = result.stdout.strip()  # stdout: the id alone, as for a job that runs (ID=$(corral submit ...))
    assert re.fullmatch(r"[a-z2-9]{8}", job_id), result.stdout
    # stderr: how it ended, as `corral wait` says it, and the end of its log.
    assert f"job {job_id} failed: exited with code 3" in result.stderr, result.stderr
    assert "no such file: data.csv" in result.stderr and f"corral logs {job_id}" in result.stderr

    result = _submit(server, "--", "corral-no-such-command", token=ALICE)  # a typo in the command
    assert result.exit_code == 1 and "failed: " in result.stderr, result.output

    result = _submit(server, "--json", "--", PY, "-c", "raise SystemExit(4)", token=ALICE)
    assert result.exit_code == 1, result.output
    job = json.loads(result.stdout)  # one document: the job as it stood after the check
    assert job["phase"] == "failed" and job["process"]["exit_code"] == 4

    # A job that runs, or ends well, within the second: the id, exit 0, as before.
    result = _submit(server, "--", PY, "-c", "pass", token=ALICE)
    assert result.exit_code == 0 and re.fullmatch(r"[a-z2-9]{8}\n", result.stdout), result.output
    result = _submit(server, "--", PY, "-c", "import time; time.sleep(60)", token=ALICE)
    assert result.exit_code == 0 and re.fullmatch(r"[a-z2-9]{8}\n", result.stdout), result.output
    assert run(server, "cancel", result.stdout.strip(), token=ALICE)[0] == 0
    # --no-check: back at once, whatever becomes of the job.
    result = _submit(server, "--no-check", "--", PY, "-c", "raise SystemExit(3)", token=ALICE)
    assert result.exit_code == 0 and re.fullmatch(r"[a-z2-9]{8}\n", result.stdout), result.output
    assert wait_phase(server, result.stdout.strip(), "failed")["phase"] == "failed"


def test_jobs_shows_the_jobs_that_failed_lately(server: Server) -> None:
    result = _submit(server, "--name", "broken", "--", PY, "-c", "raise SystemExit(5)", token=BOB)
    assert result.exit_code == 1, result.output
    failed = result.stdout.strip()
    code, out = run(server, "jobs", token=BOB)
    assert code == 0, out
    assert "failed or rejected in the last 10 minutes" in out, out
    assert _cell(out, "reason", failed) == "exited with code 5" and _cell(out, "name", failed) == "broken"
    assert re.search(r"\d+s ago", _cell(out, "ended", failed)), out
    code, out = run(server, "jobs", token=ALICE)  # another tenant's failure is not shown
    assert code == 0 and failed not in out, out
    # The other views are what they say: --all lists it once, among the others; --phase, only that phase.
    code, out = run(server, "jobs", "--all", token=BOB)
    assert out.count(failed) == 1 and "in the last 10 minutes" not in out, out
    code, out = run(server, "jobs", "--phase", "running", token=BOB)
    assert failed not in out, out


def test_recent_failures_are_those_that_ended_in_the_last_ten_minutes() -> None:
    from corral.cli.live import _recent_failures

    now = 1_000_000.0
    jobs = [
        {"job_id": "old", "end_s": now - 601},
        {"job_id": "new", "end_s": now - 5},
        {"job_id": "mid", "end_s": now - 300},
    ]
    asked: dict[str, Any] = {}

    class Api:
        def jobs_page(self, **query: Any) -> Any:
            asked.update(query)
            return {"jobs": jobs, "total": len(jobs), "next_cursor": None}

    found = _recent_failures(Api(), "vision", now)  # type: ignore[arg-type]
    assert [j["job_id"] for j in found] == ["new", "mid"]  # the latest first
    assert asked["phases"] == ("failed", "rejected") and asked["newest_first"] and asked["tenant"] == "vision"


def test_submit_export_env(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPORTED_A", "from me")
    monkeypatch.setenv("EXPORTED_B", "mine too")
    script = "import os; print('seen:', os.environ.get('EXPORTED_A'), '|', os.environ.get('EXPORTED_B'))"
    # Without --export-env the job gets none of the submitter's environment.
    code, out = run(server, "submit", "--wait", "--", PY, "-c", script, token=ALICE)
    assert code == 0 and "seen: None | None" in run(server, "logs", out.splitlines()[0], token=ALICE)[1]
    # Named variables; --env wins over an exported one.
    code, out = run(server, "submit", "--export-env", "EXPORTED_A,EXPORTED_B", "--env", "EXPORTED_B=explicit",
                    "--json", "--", PY, "-c", script, token=ALICE)  # fmt: skip
    assert code == 0, out
    job = json.loads(out)
    assert job["env"] == {"EXPORTED_A": "from me", "EXPORTED_B": "explicit"}
    wait_phase(server, job["job_id"], "finished")
    assert "seen: from me | explicit" in run(server, "logs", job["job_id"], token=ALICE)[1]
    # ALL: everything but CORRAL_* (the token among them) and what the job has of its own.
    code, out = run(server, "submit", "--export-env", "ALL", "--json", "--", PY, "-c", "pass", token=ALICE)
    assert code == 0, out
    env = json.loads(out)["env"]
    assert env["EXPORTED_A"] == "from me" and env["PATH"] == os.environ["PATH"]
    assert not [k for k in env if k.startswith("CORRAL_")] and ALICE not in env.values()  # CORRAL_TOKEN was set
    assert "HOME" not in env
    # Errors: one line, nothing submitted.
    monkeypatch.delenv("EXPORTED_UNSET", raising=False)
    for args, words in (
        (("EXPORTED_A,EXPORTED_UNSET",), "--export-env: EXPORTED_UNSET is not set in this environment"),
        (("CORRAL_TOKEN",), "--export-env: CORRAL_TOKEN is corral's own"),
        (("A=1",), "give a value with --env KEY=VALUE"),
        (("EXPORTED_A,",), "expected ALL or NAME[,NAME...]"),
    ):
        code, out = run(server, "submit", "--export-env", *args, "--", "true", token=ALICE)
        assert code == 2 and out.startswith("error: ") and words in out and len(out.splitlines()) == 1, out


def test_exported_env_merges_names_and_all() -> None:
    from corral.cli.live import exported_env

    environ = {"A": "1", "B": "2", "CORRAL_URL": "u", "HOME": "/home/me", "CUDA_VISIBLE_DEVICES": "0", "PWD": "/x"}
    assert exported_env(["A"], environ) == {"A": "1"}
    assert exported_env(["A, B"], environ) == {"A": "1", "B": "2"}
    assert exported_env(["A", "B"], environ) == {"A": "1", "B": "2"}  # repeated
    assert exported_env(["ALL"], environ) == {"A": "1", "B": "2"}
    assert exported_env(["ALL,HOME"], environ) == {"A": "1", "B": "2", "HOME": "/home/me"}  # named: passed
    assert exported_env([], environ) == {}


def test_the_docs_describe_every_key_of_a_job_file() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "live.md").read_text()
    section = docs.split("### Job files", 1)[1].split("\n#", 1)[0]
    missing = [key for key in live_cli._JOB_FILE_KEYS if f"`{key}`" not in section]
    assert not missing, f"docs/live.md, Job files, does not describe {missing}"


# -- estimates ----------------------------------------------------------------------------------------------------
def test_submit_test_only_says_where_and_when_and_submits_nothing(server: Server) -> None:
    code, out = run(server, "jobs", "--all", "--json")
    before = json.loads(out)["total"]
    code, out = run(server, "submit", "--test-only", "--expect", "90m", "--", PY, "-c", "pass", token=ALICE)
    assert code == 0, out
    assert re.search(r"would start (now|in \S+.*) on GPU \d \(local\); nothing was submitted", out), out
    code, out = run(server, "submit", "--test-only", "--json", "--", PY, "-c", "pass", token=BOB)
    assert code == 0, out
    found = json.loads(out)
    assert found["start_s"] is not None and found["gpus"] in ([0], [1]) and found["nodes"] == ["local"]
    code, out = run(server, "jobs", "--all", "--json")
    assert json.loads(out)["total"] == before
    code, out = run(server, "submit", "--test-only", "--gpus", "2", "--", PY, "-c", "pass", token=BOB)
    assert code != 0 and "quota of 1 GPU;" in out  # what a submission would be refused for, said the same way
    code, out = run(server, "submit", "--expect", "soon", "--", PY, "-c", "pass", token=ALICE)
    assert code == 2 and "--expect" in out and "90s, 30m" in out


def test_whatif_accuracy_needs_the_admin_and_says_what_it_has(server: Server) -> None:
    code, out = run(server, "whatif", "accuracy")
    assert code == 0, out
    assert "nothing to judge" in out or "start-time estimates against real starts" in out
    code, out = run(server, "whatif", "accuracy", token=ALICE)
    assert code != 0 and "admin token" in out
    code, out = run(server, "whatif", "--out", "x")
    assert code != 0 and "--policy" in out
    code, out = run(server, "whatif", "--policy", "tiresias")
    assert code == 0, out
    assert "the current queue under fifo (this server's) and under tiresias" in out and "median wait" in out
