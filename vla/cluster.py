"""Scale-out on Ray (``pip install -e .[scale]``): ``vla eval --workers N`` (``vla.evaluate.evaluate_on_workers``)
and ``vla rl --actors N`` (``session.pool``) start their workers as Ray actors, on a local Ray cluster by default
or on an existing one (``--ray-address``). Each worker drives a robot of its own:

* a simulated site (every device a simulator, e.g. ``sim-franka-fast``) is copied onto loopback ports leased by
  the worker on its own machine (``robot_io.ports.PortLease``: no two workers, nor two benchmarks using leases,
  get the same port) and served by a bridge the worker starts and stops (``worker_robot``);
* a real robot is one site per worker (``--actor-robots``), reached as it is: its bridge runs next to the robot.

What every node needs: this project installed (``pip install -e .[scale]``; the same checkpoint paths, or a shared
file system), and for a learner reached from other machines, CurveZMQ keys at the same path on each node.

A local cluster keeps Ray's own output off the terminal (``logging_level`` ERROR, workers' logs in Ray's session
folder, not on the driver's terminal; the dashboard off) and leaves Ray's token authentication at its default
(on for a new local cluster since Ray 2.5x, its notice silenced). The workers' own logs go to files the command
names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any, Iterator

from robot_io.site import SiteConfig

SCALE_HINT = "pip install -e .[scale]"


class ClusterError(ValueError):
    """Ray cannot run the workers as asked (a user error: the CLI prints it in one line)."""


class RayMissing(ClusterError, ImportError):
    """Ray is not installed."""


def require_ray(flag: str):
    """The ``ray`` module, or RayMissing naming the flag that needs it and how to install it."""
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # Ray's C++ warnings (retries, reconnects): log files only
    try:
        import ray
    except ImportError:
        raise RayMissing(f"{flag} runs its workers on Ray, which is not installed: {SCALE_HINT}") from None
    return ray


@contextlib.contextmanager
def ray_cluster(flag: str, address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray for the span of a command: a new local cluster with ``num_cpus`` CPUs (the workers take one each),
    or the running cluster at ``address`` (``auto``: the one started on this machine with ``ray start``), which
    must have ``num_cpus`` free; shut down (disconnected) on exit. -> the ``ray`` module."""
    ray = require_ray(flag)
    if ray.is_initialized():
        raise ClusterError(f"{flag}: Ray is already initialised in this process")
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    if address:
        try:
            with _stderr_to(RAY_INIT_LOG):
                ray.init(address=address, **quiet)
        except ConnectionError as e:
            auth = "" if os.environ.get("RAY_AUTH_MODE") else (
                " A cluster with token authentication (Ray's default for a new cluster) asks for its token: "
                "--ray-address auto finds a cluster on this machine and its token; for another address set "
                "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, or ~/.ray/auth_token).")
            raise ClusterError(f"--ray-address {address}: could not connect ({e}; Ray's messages: {RAY_INIT_LOG}). "
                               "Start a cluster with `ray start --head` (then --ray-address auto) or leave "
                               f"--ray-address out for a local one.{auth}") from None
    else:
        # "local": a new instance of our own, even where RAY_ADDRESS is set or `ray start` left one running
        with _stderr_to(RAY_INIT_LOG):
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **quiet)
    try:
        free = ray.available_resources().get("CPU", 0)
        if num_cpus and free < num_cpus:  # the workers take a CPU each: the rest would wait for ever
            raise ClusterError(f"{flag} {num_cpus}: the Ray cluster at {address or 'this machine'} has {free:g} free "
                               "CPUs; start fewer workers or add nodes")
        yield ray
    finally:
        ray.shutdown()


RAY_INIT_LOG = os.path.join(tempfile.gettempdir(), "vla-ray-init.log")
"""Where Ray's own messages while it starts or connects go (its C++ core writes them to the process's stderr)."""


@contextlib.contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """File descriptor 2 (C++ code writes there too, not only ``sys.stderr``) appended to ``path`` for the block."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "a") as f:
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def log_dir(folder: str, local: bool) -> str:
    """Where a worker writes its logs: ``folder`` on a local cluster; on another cluster (``folder`` is this
    machine's path) a folder of the same name in the node's temp folder."""
    return folder if local else os.path.join(tempfile.gettempdir(), "vla-workers",
                                             os.path.basename(os.path.dirname(os.path.abspath(folder))))


def worker_log(directory: str, name: str) -> str:
    """A log file path in ``directory`` (made if needed; the node's temp folder if it cannot be)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        directory = tempfile.gettempdir()
    return os.path.join(directory, name)


@contextlib.contextmanager
def worker_robot(robot: str, logs: str, name: str, tries: int = 3) -> Iterator[SiteConfig]:
    """The robot of one worker, its bridge answering, for the span of the block. A simulated site (preset or
    YAML) is copied onto loopback ports leased on this machine and served by a bridge started here (stopped on
    exit; should another program take a leased port before the bridge binds it, a new lease is tried, ``tries``
    times). Any other site is a real robot's: reached as it is, its bridge already running next to it.
    ``logs``: the folder of the bridge's log and the site copy; ``name``: this worker's name in them."""
    from robot_io.bridge_process import BridgeExited, is_simulated, running_bridge
    from robot_io.ports import PortLease
    from robot_io.site import load_site, relocate_site, site_ports

    site = load_site(robot)
    if not is_simulated(site):
        with running_bridge(site, worker_log(logs, f"{name}-bridge.log"), start="never"):
            yield site
        return
    n = len(site_ports(site))
    for attempt in range(tries):
        with contextlib.ExitStack() as stack:
            lease = stack.enter_context(PortLease(n))
            copy = relocate_site(site, lease.ports, worker_log(logs, f"{name}-site.yaml"),
                                 name=f"{site.name}-{name}")
            try:
                stack.enter_context(running_bridge(copy, worker_log(logs, f"{name}-bridge.log"), start="always"))
            except BridgeExited:
                if attempt == tries - 1:
                    raise
                continue  # a port was taken after the lease checked it: lease others
            yield copy
            return
