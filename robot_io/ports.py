"""Loopback TCP ports for bridges started side by side (``vla eval --workers``, ``vla rl --actors``,
benchmarks): a :class:`PortLease` holds ports that were free when taken and that no other lease on
this machine holds until it is released.

Two processes that each pick "a free port" (bind to port 0, close, hand the number to a bridge)
can pick the same one between the close and the bridge's bind. A lease closes that gap among
leases: every leased port has a lock file ``<tmp>/vla-ports/<port>.lock`` held with ``flock`` by the
leasing process, so a concurrent lease (another worker, another benchmark) skips it; the kernel
drops the lock when the process dies, so a killed worker leaks nothing. Ports are drawn below the
kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which outgoing connections
take their local ports from, and each is checked free by binding it. A program that does not use
leases can still take a port before the bridge binds it: the bridge then fails to start, and the
caller takes a new lease (``vla.cluster.worker_robot`` does, a few times).

numpy-free, torch-free: the standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
import warnings

LOCK_DIR = os.path.join(tempfile.gettempdir(), "vla-ports")
LOW = 20_000
"""Lowest port a lease takes."""


def _ephemeral_low(default: int = 32_768) -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


class PortLease:
    """``n`` distinct loopback TCP ports, free when leased and held against other leases until
    :meth:`release` (or the process exits). A context manager."""

    def __init__(self, n: int, host: str = "127.0.0.1", attempts: int = 2000) -> None:
        if n < 1:
            raise ValueError(f"a port lease needs n >= 1, got {n}")
        os.makedirs(LOCK_DIR, exist_ok=True)
        high = _ephemeral_low()
        if high - LOW < 4 * n:
            raise RuntimeError(f"no room for {n} ports between {LOW} and the ephemeral range at {high}")
        self.ports: list[int] = []
        self._locks: list[int] = []
        rnd = random.Random(int.from_bytes(os.urandom(8), "little"))
        try:
            for _ in range(attempts):
                if len(self.ports) == n:
                    break
                port = rnd.randrange(LOW, high)
                if port in self.ports:
                    continue
                fd = self._lock(port)
                if fd is None:
                    continue
                if not _bindable(host, port):
                    os.close(fd)
                    continue
                self.ports.append(port)
                self._locks.append(fd)
            if len(self.ports) < n:
                raise RuntimeError(f"could not lease {n} free loopback ports in {attempts} attempts "
                                   f"(ports {LOW}..{high - 1}, locks in {LOCK_DIR})")
        except BaseException:
            self.release()
            raise

    @staticmethod
    def _lock(port: int) -> int | None:
        fd = os.open(os.path.join(LOCK_DIR, f"{port}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None  # another lease holds it
            raise
        return fd

    def release(self) -> None:
        """Give the ports back (their lock files stay, unlocked, for the next lease)."""
        for fd in self._locks:
            try:
                os.close(fd)
            except OSError as e:  # release runs on the way out of errors too: say so, free the others
                warnings.warn(f"port lease: could not close lock file descriptor {fd}: {e}", RuntimeWarning)
        self._locks.clear()

    def __enter__(self) -> "PortLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def free_block(n: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A base port ``p`` with ``p .. p + n - 1`` all free now (each bound while checking), drawn below the
    ephemeral range: for a program that gives its bridges ports from one base (``bench/rig.py``, the bench
    tests' ``--port0``). Not a lease: nothing holds the ports afterwards."""
    high = _ephemeral_low()
    rnd = random.Random(int.from_bytes(os.urandom(8), "little"))
    for _ in range(attempts):
        base = rnd.randrange(LOW, high - n)
        if all(_bindable(host, p) for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no {n} consecutive free loopback ports in {LOW}..{high - 1} after {attempts} tries")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
