"""Sim sites on leased ports: a bench that runs bridges side by side (parallel sessions, sim workers, a bench next
to another bench) gives each a copy of a sim preset on loopback ports held by a ``robot_io.ports.PortLease``
(no other lease on the machine takes them) -- or, with ``--port0``, on the fixed ports port0 + 20 j ... as
before the leases. ``running_bridge`` is the product's (``robot_io.bridge_process``)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import yaml

from robot_io.bridge_process import running_bridge
from robot_io.ports import PortLease
from robot_io.site import load_site, relocate_site, site_ports

__all__ = ["running_bridge", "site_with_ports", "bench_sites", "site_copy", "lease_ports", "SITE_STRIDE"]

SITE_STRIDE = 20
"""With ``--port0``: site j's ports start at port0 + SITE_STRIDE j."""
_HELD: list[PortLease] = []


def site_with_ports(path: str, port0: int, base: str = "sim-franka-fast") -> str:
    """A copy of the ``base`` sim preset written to ``path`` on the fixed ports port0 ... port0 + 9 (in the order
    its devices name them). -> ``path``. Prefer :func:`bench_sites`, whose ports are leased."""
    with open(load_site(base).path) as f:
        site = yaml.safe_load(f)
    ports = iter(range(port0, port0 + 10))
    for dev in site["devices"].values():
        for key in ("command", "stream"):
            if key in dev:
                dev[key] = f"tcp://127.0.0.1:{next(ports)}"
    site["name"] = f"bench-dsrl-{port0}"
    with open(path, "w") as f:
        yaml.safe_dump(site, f)
    return path


@contextlib.contextmanager
def bench_sites(n: int, folder: str, port0: int | None = None, base: str = "sim-franka-fast") -> Iterator[list[str]]:
    """``n`` copies of the ``base`` sim preset written to ``folder/site{j}.yaml``, for the span of the block: on
    ports leased for the block (``port0`` None), or on the fixed ports port0 + 20 j ... -> their paths."""
    if port0 is not None:
        yield [site_with_ports(os.path.join(folder, f"site{j}.yaml"), port0 + SITE_STRIDE * j, base)
               for j in range(n)]
        return
    site = load_site(base)
    with contextlib.ExitStack() as stack:
        paths = []
        for j in range(n):
            lease = stack.enter_context(PortLease(len(site_ports(site))))
            paths.append(relocate_site(site, lease.ports, os.path.join(folder, f"site{j}.yaml")).path)
        yield paths


def lease_ports(n: int) -> list[int]:
    """``n`` loopback ports leased until this process exits (for a bench that writes its own site file or
    starts its own servers)."""
    lease = PortLease(n)
    _HELD.append(lease)
    return list(lease.ports)


def site_copy(path: str, port0: int | None = None, base: str = "sim-franka-fast") -> str:
    """One copy of the ``base`` sim preset written to ``path``: on the fixed ports port0 ... (``site_with_ports``),
    or, with ``port0`` None, on ports leased until this process exits. -> ``path``."""
    if port0 is not None:
        return site_with_ports(path, port0, base)
    site = load_site(base)
    return relocate_site(site, lease_ports(len(site_ports(site))), path).path
