"""The channel's messages are checked where they are read (:func:`corral.core.contract.decode`): every field typed
and bounded, so that nothing a job sends can raise further in, on the agent or in the controller; and the job's
channel signs its hello with the run's secret."""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from typing import Any

import pytest
from job_agent_peer import AgentPeer

from corral.core import contract
from corral.core.errors import InputError
from corral.job.channel import AgentChannel

GOOD_STEP: dict[str, Any] = dict(
    type="step", job_id="7", run=1, step=3, steps=2, step_time_s=0.5, busy_s=0.25, mem_peak_mib=100
)


def line(body: object) -> bytes:
    return json.dumps(body).encode()


def test_every_message_round_trips() -> None:
    messages: list[contract.Message] = [
        contract.Hello("7", 2, 1234, "ab" * 32),
        contract.StepReport("7", 2, 10, 5, 0.5, 0.25, 100, 200, 32, 300, "micro4"),
        contract.Paused("7", 2, 10, evicted=True, took_s=0.1),
        contract.Resumed("7", 2, 10, took_s=None),
        contract.Checkpointed("7", 2, 10, "/ckpt/x"),
        contract.Pause("evict", evict=True),
        contract.Resume(),
        contract.Checkpoint("preempt"),
        contract.SetBatchSize(64),
        contract.SetLimits(gpu_milli=500, mem_mib=None),
    ]
    for message in messages:
        assert contract.decode(contract.encode(message)) == message


def test_every_field_of_every_message_is_checked() -> None:
    for cls, checks in contract._FIELDS.items():
        assert set(checks) == {f.name for f in fields(cls)}, cls
    assert set(contract._FIELDS) == set(contract._TYPES.values())


def test_integers_are_accepted_where_seconds_are_expected() -> None:
    report = contract.decode(line(dict(GOOD_STEP, step_time_s=1, busy_s=0)))
    assert isinstance(report, contract.StepReport)
    assert report.step_time_s == 1.0 and isinstance(report.step_time_s, float)


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        ({"step_time_s": "slow"}, "step_time_s", "a finite number of seconds"),
        ({"step_time_s": math.nan}, "step_time_s", "a finite number of seconds"),
        ({"step_time_s": math.inf}, "step_time_s", "a finite number of seconds"),
        ({"busy_s": -0.5}, "busy_s", "a finite number of seconds"),
        ({"busy_s": 10**400}, "busy_s", "a finite number of seconds"),  # float() of it would overflow
        ({"busy_s": True}, "busy_s", "a finite number of seconds"),
        ({"step": 1.5}, "step", "an integer"),
        ({"step": -1}, "step", "an integer"),
        ({"step": 2**80}, "step", "an integer"),
        ({"step": "3"}, "step", "an integer"),
        ({"run": True}, "run", "an integer"),  # a JSON true is not a count
        ({"mem_peak_mib": False}, "mem_peak_mib", "an integer"),
        ({"mem_peak_mib": None}, "mem_peak_mib", "an integer"),
        ({"mem_cap_mib": 2**31}, "mem_cap_mib", "an integer"),
        ({"batch_size": 0}, "batch_size", "an integer"),
        ({"mem_mode": "x" * 65}, "mem_mode", "a string of at most 64"),
        ({"mem_mode": "full\x1b[2J"}, "mem_mode", "printable"),
        ({"job_id": 7}, "job_id", "a string"),
        ({"job_id": "x" * (contract.MAX_TEXT_CHARS + 1)}, "job_id", "a string"),
        ({"job_id": ["7"]}, "job_id", "a string"),
    ],
)
def test_bad_step_reports_are_refused_naming_the_field(change: dict[str, Any], field: str, expected: str) -> None:
    with pytest.raises(InputError) as caught:
        contract.decode(line(dict(GOOD_STEP, **change)))
    assert caught.value.column == field
    assert caught.value.expected is not None and expected in caught.value.expected
    assert "step message" in str(caught.value)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b'{"type": "step", "job_id": "7"}', "missing field"),
        (line(dict(GOOD_STEP, extra=1)), "unknown fields"),
        (b'{"type": "hello", "job_id": "\\ud800", "run": 1, "pid": 1}', "valid Unicode"),
        (line({"type": "hello", "job_id": "7", "run": 1, "pid": 1, "secret": "s" * 2000}), "at most"),
        (line({"type": "paused", "job_id": "7", "run": 1, "step": 1, "evicted": 1}), "true or false"),
        (line({"type": "limits", "gpu_milli": 1001}), "from 0 to 1000"),
        (line({"type": "checkpointed", "job_id": "7", "run": 1, "step": 1, "path": "p" * 5000}), "at most"),
        (b"[" * 50_000, "not JSON"),  # deep nesting: no RecursionError escapes
        (b"1" * 5000, "not JSON"),  # more digits than Python converts
        (b"NaN", "not a JSON object"),
        (line({"type": {"x": 1}}), "unknown message type"),
    ],
)
def test_malformed_messages(data: bytes, words: str) -> None:
    with pytest.raises(InputError, match=words):
        contract.decode(data)


def test_the_channel_signs_its_hello_with_the_runs_secret(peer: AgentPeer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent gives the secret in CORRAL_RUN_SECRET; the channel puts it in every hello it sends, including
    after a reconnection, without the script's greeting having to know it."""
    monkeypatch.setenv(contract.ENV_RUN_SECRET, "c0ffee" * 10)
    channel = AgentChannel(peer.path, lambda: [contract.Hello("j", 1, os.getpid())], retry_s=0.05)
    try:
        assert peer.expect(contract.Hello).secret == "c0ffee" * 10
        peer.stop()
        peer.start()
        peer.wait_connections(2)
        assert peer.expect(contract.Hello).secret == "c0ffee" * 10
    finally:
        channel.close()
    given = AgentChannel(peer.path, lambda: [contract.Hello("j", 2, os.getpid())], secret="given", retry_s=0.05)
    try:
        assert peer.expect(contract.Hello, lambda h: h.run == 2).secret == "given"
    finally:
        given.close()
