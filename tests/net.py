"""Network helpers shared by tests that start their own bridges."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (held together while choosing, so no repeats)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def free_port_block(n: int, lo: int = 20_000, hi: int = 32_000, tries: int = 200) -> int:
    """A base port p with p .. p + n - 1 all free on 127.0.0.1 right now (each bound while checking), for a
    bench that gives its sessions ports from one base. Chosen under Linux's ephemeral range (32768-60999),
    so an outgoing connection of another process cannot take one of them between choosing and binding,
    as it could from a block that starts at a port the kernel handed out."""
    import random

    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(lo, hi - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in {lo}-{hi} after {tries} tries")
