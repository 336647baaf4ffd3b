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



def free_port_block(n: int) -> int:
    """A base port p with p .. p + n - 1 all free on 127.0.0.1 right now, below the ephemeral range (a base from
    ``free_ports(1)`` checks only its first port): ``robot_io.ports.free_block``."""
    from robot_io.ports import free_block

    return free_block(n)
