"""The operator's scene reset between episodes on a real robot (no simulator to re-lay the scene).

Before every episode the session asks the operator to put the scene back and press Enter. The
robot must never start an episode unattended, so the question has a deadline: no answer within
``timeout_s`` and the answer is ``timeout`` (the hook for ``RobotEnv`` raises ``OperatorTimeout``),
the session stops at an episode boundary, where its last checkpoint is, and ``--resume`` continues
it. While nobody answers, nothing is commanded, so the bridge's watchdog holds the robot in its
safe state.

Answers: Enter = the scene is reset, start; ``q`` = stop the session; ``s`` / ``f`` = the
previous episode really was a success / failure (the operator's verdict, kept next to the reward
detector's: labels for checking or retraining a success classifier), then Enter to start.

``prompt_fn(text) -> str`` asks one question (``input`` by default; a script in tests, a GUI
button elsewhere). Plain ``input`` is replaced by ``StdinPrompt``, which waits on the terminal with
``select`` instead of a thread, so an unanswered prompt leaves no thread blocked on stdin, and it
drops keys typed during the episode (an Enter pressed then must not count as "the scene is
reset"). Any other ``prompt_fn`` runs in a worker thread; if it is still waiting at the deadline,
the next question takes over that pending answer instead of asking twice.

Pure standard library (no torch, no robot_io): it runs wherever the session's actor runs.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any, Callable

READY, STOP, TIMEOUT = "ready", "stop", "timeout"
HELP = "Enter = scene is reset, start | s = last episode succeeded | f = it failed | q = stop the session"


class OperatorStop(Exception):
    """The operator ended the session (or nobody answered): stop at this episode boundary."""


class OperatorTimeout(OperatorStop):
    """Nobody answered the reset prompt in time: the session pauses, the robot stays in its safe state."""


@dataclasses.dataclass(frozen=True)
class ResetAnswer:
    status: str
    """ready: the scene is reset, start the episode | stop: the operator ends the session |
    timeout: no answer in time (or stdin closed): do not start."""
    outcome: bool | None = None
    """The operator's verdict on the previous episode (s = True, f = False), if they gave one."""
    waited_s: float = 0.0
    detail: str = ""


class StdinPrompt:
    """``input()`` with a timeout, on a POSIX terminal or pipe, without a thread.

    ``__call__(text, timeout=None) -> line`` raises ``TimeoutError`` when no full line arrived in
    time and ``EOFError`` when the stream closed. On a terminal, bytes typed before the question
    are dropped. Reads the file descriptor directly (not ``sys.stdin``'s buffer); give ``fd`` to
    read something else (tests use a pipe)."""

    def __init__(self, fd: int | None = None, out=None) -> None:
        self.fd = sys.stdin.fileno() if fd is None else fd
        self.out = out
        self._buf = b""
        self._eof = False

    def _read_ready(self, timeout: float) -> bool:
        import select

        r, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not r:
            return False
        chunk = os.read(self.fd, 4096)
        if not chunk:
            self._eof = True
        self._buf += chunk
        return True

    def drain(self) -> None:
        """Drop what was typed before now (terminals only: on a pipe, lines are scripted answers)."""
        if not os.isatty(self.fd):
            return
        while not self._eof and self._read_ready(0.0):
            pass
        self._buf = b""

    def __call__(self, text: str, timeout: float | None = None) -> str:
        out = self.out or sys.stdout
        out.write(text)
        out.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            if self._eof:
                raise EOFError("stdin closed")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no answer within {timeout:g} s")
            self._read_ready(3600.0 if left is None else left)
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace").rstrip("\r")


class _Pending:
    """One ``prompt_fn`` call in a worker thread."""

    def __init__(self, fn: Callable[[str], str], text: str) -> None:
        self.done = threading.Event()
        self.value: str | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, text), daemon=True, name="operator-prompt").start()

    def _run(self, fn, text) -> None:
        try:
            self.value = fn(text)
        except BaseException as e:  # noqa: BLE001 - handed to the asking thread, which raises it
            self.error = e
        finally:
            self.done.set()

    def result(self) -> str:
        if self.error is not None:
            raise self.error
        if not isinstance(self.value, str):  # a None must not read as a bare Enter ("start")
            raise TypeError(f"prompt_fn must return the operator's line as a str, got {self.value!r}")
        return self.value


class OperatorReset:
    """Asks the operator to reset the scene; ``__call__(episode=None) -> ResetAnswer``.

    ``timeout_s``: the whole exchange must end within it (``None``: wait for ever; the robot still
    does not start unattended). ``print_fn`` shows the instructions. ``bell`` rings the terminal
    bell with the question."""

    def __init__(self, prompt_fn: Callable[[str], str] = builtins.input, timeout_s: float | None = 300.0,
                 print_fn: Callable[[str], Any] = print, bell: bool = True) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive (or None to wait for ever), got {timeout_s}")
        if prompt_fn is builtins.input and os.name == "posix" and _stdin_fd() is not None:
            prompt_fn = StdinPrompt()
        self.prompt_fn, self.timeout_s, self.print_fn, self.bell = prompt_fn, timeout_s, print_fn, bell
        self._pending: _Pending | None = None

    def _ask(self, text: str, left: float | None) -> str:
        """One line from the operator; TimeoutError / EOFError as StdinPrompt."""
        if isinstance(self.prompt_fn, StdinPrompt):
            return self.prompt_fn(text, timeout=left)
        if self._pending is None:  # else: the last question is still open; its answer is this one
            self._pending = _Pending(self.prompt_fn, text)
        if not self._pending.done.wait(left):
            raise TimeoutError(f"no answer within {self.timeout_s:g} s")
        pending, self._pending = self._pending, None
        return pending.result()

    def __call__(self, episode: int | None = None, ask_outcome: bool = True) -> ResetAnswer:
        t0 = time.monotonic()
        deadline = None if self.timeout_s is None else t0 + self.timeout_s
        what = "the next episode" if episode is None else f"episode {episode}"
        limit = "" if self.timeout_s is None else f" (the session pauses after {self.timeout_s:g} s without an answer)"
        self.print_fn(f"{chr(7) if self.bell else ''}reset the scene for {what}{limit}\n  {HELP}")
        if isinstance(self.prompt_fn, StdinPrompt):
            self.prompt_fn.drain()
        outcome: bool | None = None
        text = "ready? [Enter/s/f/q] "
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                if left is not None and left <= 0:
                    raise TimeoutError
                answer = self._ask(text, left).strip().lower()
            except TimeoutError:
                return ResetAnswer(TIMEOUT, outcome, time.monotonic() - t0,
                                   f"no answer within {self.timeout_s:g} s: not starting an unattended episode")
            except EOFError:
                return ResetAnswer(TIMEOUT, outcome, time.monotonic() - t0,
                                   "stdin is closed: no operator can answer, not starting an unattended episode")
            if answer == "":
                return ResetAnswer(READY, outcome, time.monotonic() - t0)
            if answer in ("q", "quit", "stop"):
                return ResetAnswer(STOP, outcome, time.monotonic() - t0, "the operator stopped the session")
            if answer in ("s", "success", "f", "fail", "failure") and ask_outcome:
                outcome = answer.startswith("s")
                self.print_fn(f"  previous episode marked {'SUCCESS' if outcome else 'FAILURE'}; "
                              "press Enter once the scene is reset")
                text = "ready? [Enter/q] "
            elif answer in ("s", "success", "f", "fail", "failure"):
                self.print_fn("  there is no previous episode to mark; press Enter once the scene is reset")
            else:
                self.print_fn(f"  {answer!r}? {HELP}")


def _stdin_fd() -> int | None:
    try:
        return sys.stdin.fileno() if sys.stdin is not None else None
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor (pytest, IDEs)
        return None


def operator_reset(prompt_fn: Callable[[str], str] = builtins.input, timeout_s: float | None = 300.0,
                   episode: int | None = None, ask_outcome: bool = True,
                   print_fn: Callable[[str], Any] = print) -> ResetAnswer:
    """Ask once (see the module docstring). For a session, keep one ``OperatorReset`` instead: it
    carries an unanswered question over to the next call."""
    return OperatorReset(prompt_fn, timeout_s, print_fn)(episode, ask_outcome)


class OperatorResetHook:
    """``reset_fn(env, seed)`` for ``robot_io.RobotEnv`` on a real robot: first the robot goes to
    its reset pose (``home(env, seed)``; default ``env.client.reset(seed)``), then the operator
    resets the scene. ``q`` raises ``OperatorStop``, no answer raises ``OperatorTimeout``; either way
    ``env.reset`` fails and no episode starts.

    The operator's verdicts (``s`` / ``f``) are kept in ``verdicts`` as
    ``{"seed": <the previous episode's seed>, "operator_success": bool, "time": unix}`` and, with
    ``log_path``, appended to that JSON-lines file (join it with the session's episode log by seed)."""

    def __init__(self, ask: OperatorReset | None = None, home: Callable[[Any, int | None], None] | None = None,
                 log_path: str | None = None) -> None:
        self.ask = ask or OperatorReset()
        self.home = home if home is not None else (lambda env, seed: env.client.reset(seed))
        self.log_path = log_path
        self.verdicts: list[dict[str, Any]] = []
        self.last: ResetAnswer | None = None
        self.resets = 0
        self._prev_seed: int | None = None
        self._has_prev = False

    def __call__(self, env, seed: int | None) -> None:
        self.home(env, seed)
        ans = self.ask(episode=self.resets, ask_outcome=self._has_prev)
        self.last = ans
        if ans.outcome is not None:
            v = {"seed": self._prev_seed, "operator_success": ans.outcome, "time": time.time()}
            self.verdicts.append(v)
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(v) + "\n")
        if ans.status == TIMEOUT:
            raise OperatorTimeout(f"{ans.detail}; the session is paused at an episode boundary")
        if ans.status == STOP:
            raise OperatorStop(ans.detail)
        assert ans.status == READY, ans
        self.resets += 1
        self._prev_seed, self._has_prev = seed, True
