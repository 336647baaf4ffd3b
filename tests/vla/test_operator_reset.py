"""The operator reset prompt: scripted answers, the timeout that keeps a robot from starting an
unattended episode, stdin through a pipe, and the RobotEnv reset hook."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from vla.operator_reset import (READY, STOP, TIMEOUT, OperatorReset, OperatorResetHook, OperatorStop,
                                OperatorTimeout, StdinPrompt, operator_reset)


def scripted(*answers):
    """A prompt_fn that answers from a list and records the questions."""
    it = iter(answers)
    asked: list[str] = []

    def prompt(text: str) -> str:
        asked.append(text)
        return next(it)

    prompt.asked = asked
    return prompt


def quiet(_msg: str) -> None:
    pass


@pytest.mark.parametrize("answers, status, outcome", [
    ([""], READY, None),
    (["s", ""], READY, True),
    (["F", "  "], READY, False),
    (["s", "f", ""], READY, False),  # the last verdict counts
    (["what?", ""], READY, None),    # unknown answers re-ask, they never start the robot
    (["q"], STOP, None),
    (["s", "quit"], STOP, True),
])
def test_scripted_answers(answers, status, outcome):
    prompt = scripted(*answers)
    ans = operator_reset(prompt, timeout_s=5, print_fn=quiet)
    assert (ans.status, ans.outcome) == (status, outcome)
    assert len(prompt.asked) == len(answers)


def test_no_verdict_without_a_previous_episode():
    msgs: list[str] = []
    ans = operator_reset(scripted("s", ""), timeout_s=5, ask_outcome=False, print_fn=msgs.append)
    assert ans.status == READY and ans.outcome is None
    assert any("no previous episode" in m for m in msgs)


def test_timeout_returns_timeout_and_the_late_answer_is_not_lost():
    release = threading.Event()
    calls = []

    def slow(text):
        calls.append(text)
        release.wait(5)
        return ""

    ask = OperatorReset(slow, timeout_s=0.2, print_fn=quiet)
    t0 = time.monotonic()
    ans = ask(episode=3)
    assert ans.status == TIMEOUT and "0.2 s" in ans.detail
    assert 0.15 < time.monotonic() - t0 < 2.0
    release.set()  # the operator comes back and presses Enter: the next question takes that answer
    assert ask(episode=3).status == READY
    assert len(calls) == 1  # ... without asking a second, competing question


def test_prompt_errors_travel_and_eof_is_no_operator():
    def broken(text):
        raise RuntimeError("GUI died")

    with pytest.raises(RuntimeError, match="GUI died"):
        operator_reset(broken, timeout_s=5, print_fn=quiet)

    def closed(text):
        raise EOFError

    ans = operator_reset(closed, timeout_s=5, print_fn=quiet)
    assert ans.status == TIMEOUT and "stdin is closed" in ans.detail
    with pytest.raises(TypeError, match="str"):
        operator_reset(lambda text: None, timeout_s=5, print_fn=quiet)  # None must not read as Enter
    with pytest.raises(ValueError):
        OperatorReset(scripted(""), timeout_s=0)


def test_stdin_prompt_over_a_pipe():
    r, w = os.pipe()
    try:
        sink = open(os.devnull, "w")
        ask = OperatorReset(StdinPrompt(fd=r, out=sink), timeout_s=0.2, print_fn=quiet)
        t0 = time.monotonic()
        assert ask().status == TIMEOUT  # nothing typed
        assert time.monotonic() - t0 < 2.0
        os.write(w, b"s\n")  # verdict and Enter arrive in separate writes, after the question
        threading.Timer(0.05, os.write, (w, b"\n")).start()
        ask.timeout_s = 5
        ans = ask()
        assert (ans.status, ans.outcome) == (READY, True)
        os.write(w, b"q\r\n")
        assert ask().status == STOP
        os.close(w)
        w = -1
        assert ask().status == TIMEOUT  # EOF: no operator
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
        sink.close()


class FakeClient:
    """Just enough of robot_io.robot.RobotClient for RobotEnv."""

    sync = True
    description: dict = {}

    def __init__(self):
        self.resets, self.commands = [], []

    def observe(self, instruction, newer_than_ns=0, cameras_newer_than_ns=0):
        return {"images": {"front": np.zeros((8, 8, 3), np.uint8)}, "state": np.zeros(8, np.float32),
                "instruction": instruction, "t": {"state": time.monotonic_ns()}}

    def reset(self, seed=None):
        self.resets.append(seed)

    def ee_delta(self, row):
        self.commands.append(row)
        raise AssertionError("no command may be sent")

    def close(self):
        pass


def test_robot_env_hook_homes_then_asks_and_never_starts_unattended(tmp_path):
    from robot_io.env import RobotEnv

    client = FakeClient()
    log = tmp_path / "verdicts.jsonl"
    hook = OperatorResetHook(OperatorReset(scripted("", "f", "", "q"), timeout_s=5, print_fn=quiet), log_path=str(log))
    env = RobotEnv(client, instruction="fold", reset_fn=hook)
    env.reset(seed=10)
    env.reset(seed=11)  # the operator says episode seed 10 failed
    assert client.resets == [10, 11] and hook.resets == 2
    assert [(v["seed"], v["operator_success"]) for v in hook.verdicts] == [(10, False)]
    assert [json.loads(x)["seed"] for x in log.read_text().splitlines()] == [10]
    with pytest.raises(OperatorStop, match="stopped"):
        env.reset(seed=12)
    # nobody there: the reset fails with OperatorTimeout (an OperatorStop) and nothing moves
    never = threading.Event()
    hook = OperatorResetHook(OperatorReset(lambda text: never.wait(5) and "", timeout_s=0.1, print_fn=quiet))
    env = RobotEnv(client, instruction="fold", reset_fn=hook)
    with pytest.raises(OperatorTimeout, match="paused"):
        env.reset(seed=13)
    never.set()
    assert client.commands == [] and hook.resets == 0
