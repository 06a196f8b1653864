"""The serve configuration: a good file, flags over the file, the admin token kept across starts, and every bad
value refused with the file, the key and what was expected."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.core.errors import InputError
from corral.live.config import (
    ServeConfig,
    TenantConfig,
    ensure_admin_token,
    load_config,
    parse_expected_node,
    remove_server_file,
    write_server_file,
)

GOOD = """
[server]
host = "127.0.0.1"
port = 9000
policy = "tiresias"
gpus = 4
state_dir = "state"
grace_s = 5
stand_in_mem_mib = 8192

[[tenants]]
name = "vision"
quota_gpus = 2
token = "vision-token-0123456789"

[[tenants]]
name = "nlp"
token_env = "TEST_CORRAL_NLP_TOKEN"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "corral.toml"
    path.write_text(text)
    return path


def test_a_good_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CORRAL_NLP_TOKEN", "nlp-token-0123456789")
    config = load_config(write(tmp_path, GOOD))
    assert config.host == "127.0.0.1" and config.port == 9000 and config.policy == "tiresias"
    assert config.gpus == 4 and config.grace_s == 5.0 and config.stand_in_mem_mib == 8192
    assert config.state_dir == tmp_path / "state"  # relative to the file's folder
    assert config.tenants == (
        TenantConfig("vision", 2, "vision-token-0123456789"),
        TenantConfig("nlp", None, "nlp-token-0123456789"),
    )
    assert all(t.run_as is None for t in config.tenants)
    assert config.admin_token is None
    assert config.url == "http://127.0.0.1:9000"


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None)
    assert config.state_dir == tmp_path / ".corral"
    assert config.tenants == (TenantConfig("default"),)
    assert (config.host, config.port, config.policy, config.gpus) == ("127.0.0.1", 8473, "fifo", None)


def test_flags_override_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CORRAL_NLP_TOKEN", "nlp-token-0123456789")
    monkeypatch.chdir(tmp_path)
    config = load_config(
        write(tmp_path, GOOD), gpus=2, policy="fifo", port=9100, state_dir="elsewhere", grace_s=1.5, host=None
    )
    assert (config.gpus, config.policy, config.port, config.grace_s) == (2, "fifo", 9100, 1.5)
    assert config.host == "127.0.0.1"  # None: not given, the file's value stands
    assert config.state_dir == tmp_path / "elsewhere"  # a flag's relative path is the cwd's


def test_the_admin_token_is_generated_once_and_kept(tmp_path: Path) -> None:
    config = ServeConfig(state_dir=tmp_path / "st", gpus=1)
    first = ensure_admin_token(config)
    assert first.admin_token is not None and len(first.admin_token) >= 32
    path = tmp_path / "st" / "admin.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = ensure_admin_token(ServeConfig(state_dir=tmp_path / "st", gpus=1))
    assert again.admin_token == first.admin_token
    given = ensure_admin_token(ServeConfig(state_dir=tmp_path / "other", gpus=1, admin_token="x" * 20))
    assert given.admin_token == "x" * 20 and not (tmp_path / "other" / "admin.token").exists()


def test_the_server_file(tmp_path: Path) -> None:
    config = ServeConfig(state_dir=tmp_path, gpus=1)
    path = write_server_file(config, "http://127.0.0.1:1234", 42)
    assert path.read_text().strip() == '{"url": "http://127.0.0.1:1234", "pid": 42}'
    remove_server_file(config, 43)  # another server's: kept
    assert path.exists()
    remove_server_file(config, 42)
    assert not path.exists()


BAD = [
    # (file text, env, words the error must contain)
    ("[server]\nport = 70000\n", {}, ["server.port", "from 1 to 65535", "70000"]),
    ("[server]\nport = 0\n", {}, ["server.port", "from 1 to 65535"]),
    ('[server]\nport = "80"\n', {}, ["server.port", "an integer", "'80'"]),
    ("[server]\ngpus = 0\n", {}, ["server.gpus", "from 1 to 4096"]),
    ("[server]\ngpus = true\n", {}, ["server.gpus", "an integer", "True"]),
    ("[server]\ngrace_s = -1\n", {}, ["server.grace_s", "seconds >= 0"]),
    ("[server]\nprot = 80\n", {}, ["server.prot", "unknown key", "one of host, port"]),
    ("[servers]\nport = 80\n", {}, ["servers", "unknown table"]),
    ('[server]\npolicy = "nosuch"\n', {}, ["server.policy", "unknown policy 'nosuch'"]),
    ('[server]\npolicy = "fifo:nosuch=1"\n', {}, ["server.policy", "nosuch"]),
    ('[server]\nadmin_token = "short"\n', {}, ["server.admin_token", "at least 16"]),
    ('[server]\nadmin_token_env = "TEST_CORRAL_UNSET_VAR"\n', {}, ["server.admin_token_env", "TEST_CORRAL_UNSET_VAR"]),
    ('[[tenants]]\nname = "a"\nquota_gpus = -1\n', {}, ["tenants[0].quota_gpus", "integer >= 0", "-1"]),
    ('[[tenants]]\nname = "a"\n[[tenants]]\nname = "a"\n', {}, ["tenants[1].name", "duplicate tenant name"]),
    ('[[tenants]]\nname = "a b"\n', {}, ["tenants[0].name", "bad tenant name"]),
    ("[[tenants]]\nquota_gpus = 1\n", {}, ["tenants[0].name", "missing key"]),
    ('[[tenants]]\nname = "a"\nquota = 1\n', {}, ["tenants[0].quota", "unknown key"]),
    ('[[tenants]]\nname = "a"\ntoken = "0123456789abcdef0"\n[[tenants]]\nname = "b"\ntoken = "0123456789abcdef0"\n',
     {}, ["tenants[1].token", "the same token as tenants[0].token"]),
    ('[server]\nadmin_token = "0123456789abcdef0"\n[[tenants]]\nname = "a"\ntoken = "0123456789abcdef0"\n',
     {}, ["tenants[0].token", "the same token as server.admin_token"]),
    ('[[tenants]]\nname = "a"\ntoken = "short"\n', {}, ["tenants[0].token", "at least 16"]),
    ('[[tenants]]\nname = "a"\ntoken_env = "TEST_CORRAL_SHORT"\n', {"TEST_CORRAL_SHORT": "x"},
     ["tenants[0].token_env", "$TEST_CORRAL_SHORT", "at least 16"]),
    ('[[tenants]]\nname = "a"\ntoken = "0123456789abcdef0"\ntoken_env = "X"\n', {}, ["tenants[0].token", "not both"]),
    ("tenants = []\n", {}, ["tenants", "one or more"]),
    ('[[tenants]]\nname = "a"\nrun_as = 42\n', {}, ["tenants[0].run_as", "a non-empty string", "42"]),
    ('[[tenants]]\nname = "a"\nrun_as = "no-such-user-corral"\n', {},
     ["tenants[0].run_as", "no Unix user 'no-such-user-corral'", "useradd"]),
    ('[[tenants]]\nname = "a"\nrun_as = "root"\n', {}, ["tenants[0].run_as", "must not run as root"]),
    ("[server\nport = 1\n", {}, ["not valid TOML"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "env", "words"), BAD, ids=[w[0] for _t, _e, w in BAD])
def test_bad_files_name_the_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str], words: list[str]
) -> None:
    monkeypatch.delenv("TEST_CORRAL_UNSET_VAR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    for word in words:
        assert word in message, message


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.toml: cannot read"):
        load_config(tmp_path / "nope.toml")


def test_bad_flags_are_named_as_flags(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"<command line>: --port: .*from 1 to 65535"):
        load_config(None, port=99999, state_dir=str(tmp_path))
    with pytest.raises(InputError, match=r"<command line>: --gpus: "):
        load_config(None, gpus=-2, state_dir=str(tmp_path))
    with pytest.raises(InputError, match=r"<command line>: --policy: unknown policy"):
        load_config(None, policy="bogus", state_dir=str(tmp_path))


def test_configs_built_in_code_are_checked_too(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="duplicate tenant name"):
        ServeConfig(state_dir=tmp_path, tenants=(TenantConfig("a"), TenantConfig("a")))
    with pytest.raises(InputError, match="at least 16"):
        ServeConfig(state_dir=tmp_path, admin_token="short")
    with pytest.raises(InputError, match="quota_gpus"):
        ServeConfig(state_dir=tmp_path, tenants=(TenantConfig("a", -1),))
    with pytest.raises(InputError, match="the same token"):
        ServeConfig(state_dir=tmp_path, tenants=(TenantConfig("a", token="t" * 16),), admin_token="t" * 16)


def test_run_as_needs_a_root_server(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("the server runs as root here (tests/live/test_isolation.py covers run_as as root)")
    import pwd

    someone = next((p.pw_name for p in pwd.getpwall() if p.pw_uid not in (0, os.geteuid())), None)
    if someone is None:
        pytest.skip("no other user on this machine to name")
    path = write(tmp_path, f'[[tenants]]\nname = "a"\nrun_as = "{someone}"\n')
    with pytest.raises(InputError, match=r"tenants\[0\]\.run_as: corral serve runs as uid \d+, not root"):
        load_config(path)


def test_state_files_are_made_private_also_when_they_exist(tmp_path: Path) -> None:
    state = tmp_path / "st"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # as an earlier corral (or a umask) left it
    (state / "admin.token").write_text("k" * 32 + "\n")
    os.chmod(state / "admin.token", 0o644)
    config = ensure_admin_token(ServeConfig(state_dir=state, gpus=1))
    assert config.admin_token == "k" * 32
    path = write_server_file(config, "http://127.0.0.1:1", 1)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "admin.token").stat().st_mode) == 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_readable_file_with_tokens_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TEST_CORRAL_NLP_TOKEN", "nlp-token-0123456789")
    path = write(tmp_path, GOOD)  # gives vision's token literally
    os.chmod(path, 0o644)
    load_config(path)
    assert any("readable by other users (mode 0644)" in r.getMessage() for r in caplog.records)
    caplog.clear()
    os.chmod(path, 0o600)
    load_config(path)
    assert not caplog.records


def test_a_kept_admin_token_that_is_too_short_is_refused(tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text("abc\n")
    os.chmod(tmp_path / "admin.token", 0o600)
    with pytest.raises(InputError, match=r"admin\.token: the kept admin token is too short"):
        ensure_admin_token(ServeConfig(state_dir=tmp_path))


@pytest.mark.parametrize("spec", ["auto", "127.0.0.1:6379", "ray://head:10001", "local:3x2", "local:16x64"])
def test_ray_specs(tmp_path: Path, spec: str) -> None:
    config = load_config(None, state_dir=str(tmp_path / "s"), ray=spec)
    assert config.ray == spec and config.gpus is None


@pytest.mark.parametrize("spec", ["local:0x2", "local:3x0", "local:17x2", "local:3", "nowhere", "local:auto"])
def test_bad_ray_specs_are_named(tmp_path: Path, spec: str) -> None:
    with pytest.raises(InputError, match="ray") as e:
        load_config(None, state_dir=str(tmp_path / "s"), ray=spec)
    assert "local:NxG" in str(e.value)


def test_ray_and_stand_in_gpus_do_not_mix(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text('[server]\nray = "local:2x2"\ngpus = 2\ncheckpoint_dir = "ckpt"\n')
    with pytest.raises(InputError, match="gpus"):
        load_config(path)
    path.write_text('[server]\nray = "local:2x2"\ncheckpoint_dir = "ckpt"\n')
    config = load_config(path)
    assert config.checkpoint_dir == tmp_path / "ckpt"


def test_nodes_expected_to_join_later(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text('[server]\nray = "auto"\nray_expect = ["gpu-7:8", "gpu-8:4:A100-80GB"]\n')
    assert load_config(path).ray_expect == ("gpu-7:8", "gpu-8:4:A100-80GB")
    assert parse_expected_node("gpu-8:4:A100-80GB") == ("gpu-8", 4, "A100-80GB")
    assert parse_expected_node("n1:2") == ("n1", 2, None)
    # The flag, given several times, replaces the file's list.
    assert load_config(path, ray_expect=("n9:2",)).ray_expect == ("n9:2",)
    assert load_config(path, ray_expect=()).ray_expect == ("gpu-7:8", "gpu-8:4:A100-80GB")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('ray = "auto"\nray_expect = ["gpu-7"]', "NAME:GPUS"),
        ('ray = "auto"\nray_expect = ["gpu-7:0"]', "NAME:GPUS"),
        ('ray = "auto"\nray_expect = ["gpu 7:2"]', "NAME:GPUS"),
        ('ray = "auto"\nray_expect = "gpu-7:2"', "list"),
        ('ray_expect = ["gpu-7:2"]', "ray_expect without ray"),
    ],
)
def test_bad_expected_nodes_are_named(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "corral.toml"
    path.write_text("[server]\n" + toml + "\n")
    with pytest.raises(InputError, match="ray_expect") as e:
        load_config(path)
    assert message in str(e.value)


# -- policies that cannot schedule live jobs ----------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["sjf", "srtf", "srtf:preempt=false", "sjf:backfill=false"])
def test_policies_that_need_durations_are_refused_at_start(tmp_path: Path, spec: str) -> None:
    # SJF and SRTF order jobs by their trace duration; a live job has none, so they would start and then reject
    # every job. The error names where the policy came from, why, and what to use instead.
    path = write(tmp_path, f'[server]\npolicy = "{spec}"\n')
    with pytest.raises(InputError) as info:
        load_config(path)
    message = str(info.value)
    name = spec.partition(":")[0]
    assert message.startswith(f"{path}: server.policy: {name} orders jobs by their duration"), message
    for words in ("a live job has none", "reject every job", "expected a policy that needs no durations: tiresias",
                  "fifo", "themis", f"got {spec!r}"):  # fmt: skip
        assert words in message, message
    assert "sjf," not in message and "srtf," not in message  # not offered as what to use instead
    with pytest.raises(InputError, match=rf"^<command line>: --policy: {name} orders jobs by their duration"):
        load_config(None, policy=spec, state_dir=str(tmp_path / "s"))
    # The flag over the file: the policy that would run is the one checked.
    assert load_config(path, policy="tiresias").policy == "tiresias"
    with pytest.raises(InputError, match=rf"^<command line>: --policy: {name} "):
        load_config(write(tmp_path, '[server]\npolicy = "fifo"\n'), policy=spec)


def test_themis_runs_live_jobs_without_durations(tmp_path: Path) -> None:
    # Themis estimates a job without a duration from the time it has run: it is not refused.
    assert load_config(None, policy="themis", state_dir=str(tmp_path / "s")).policy == "themis"


def test_the_docs_name_every_key_of_the_configuration() -> None:
    from corral.live.config import _SERVER_KEYS, _TENANT_KEYS

    docs = (Path(__file__).parents[2] / "docs" / "live.md").read_text()
    section = docs.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    missing = [
        key for key in (*_SERVER_KEYS, *_TENANT_KEYS) if f"`{key}`" not in section and f"\n{key} =" not in section
    ]
    assert not missing, f"docs/live.md, Configuration, does not describe {missing}"
