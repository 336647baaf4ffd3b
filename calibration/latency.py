"""Clock offset and latency between the host and a device behind the bridge.

Every bridge message carries the sender's clocks in its header (``t_mono_ns``, ``t_wall_ns``),
so a ``ping`` is an NTP exchange: the host stamps ``t0`` when it sends, the device stamps its
reply ``t1`` (its clock), the host stamps ``t3`` when the reply arrives. If the two one-way
delays are equal, ``offset = t1 - (t0 + t3) / 2`` (device clock minus host clock) and the error
is at most half the round trip ``t3 - t0``. The pings with the shortest round trips are the least
disturbed, so the offset is the median over the fastest quarter of the samples; ``bound_ms`` is
half the round trip of those. Monotonic clocks of two machines have unrelated origins (the
offset is arbitrary, and it is what maps a device's frame or state stamps onto the host's
clock); wall clocks should agree to within NTP's error (the offset shows how well).

Stream delay: for a streaming device, the time from the device's stamp on a message (a camera's
capture time, an arm's state time) to its arrival at the host, on the host's clock
(``recv - (t_device - offset)``): what a control loop's observations lag behind the world.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from calibration.io import Latency, now_iso


@dataclasses.dataclass
class PingSample:
    t0_mono_ns: int  # host, request sent
    t1_mono_ns: int  # device, reply stamped
    t3_mono_ns: int  # host, reply received
    t0_wall_ns: int
    t1_wall_ns: int
    t3_wall_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.t3_mono_ns - self.t0_mono_ns


@dataclasses.dataclass
class LatencyResult:
    offset_mono_ns: int
    offset_wall_ns: int
    bound_ms: float  # half the round trip of the samples the offset came from: its worst-case error
    rtt_ms: dict[str, float]
    samples: int
    stream_delay_ms: dict[str, float] | None = None

    def section(self) -> Latency:
        return Latency(offset_mono_ns=self.offset_mono_ns, offset_wall_ns=self.offset_wall_ns,
                       rtt_ms={k: round(v, 4) for k, v in self.rtt_ms.items()}, samples=self.samples,
                       stream_delay_ms=None if self.stream_delay_ms is None else
                       {k: round(v, 4) for k, v in self.stream_delay_ms.items()}, created=now_iso())


def percentiles_ms(values_ns: Sequence[float], with_min: bool = False) -> dict[str, float]:
    v = np.asarray(values_ns, np.float64) / 1e6
    out = {"min": float(v.min())} if with_min else {}
    out.update({f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 99)})
    return out


def offset_from_samples(samples: Sequence[PingSample], best_fraction: float = 0.25) -> LatencyResult:
    """NTP-style clock offsets from ping samples (see the module docstring)."""
    if len(samples) < 4:
        raise ValueError(f"clock offset needs at least 4 ping samples, got {len(samples)}")
    rtt = np.array([s.rtt_ns for s in samples], np.float64)
    if np.any(rtt < 0):
        raise ValueError("a ping sample came back before it was sent (host clock stamps out of order)")
    k = max(1, int(round(len(samples) * best_fraction)))
    best = np.argsort(rtt, kind="stable")[:k]
    mono = [samples[i].t1_mono_ns - (samples[i].t0_mono_ns + samples[i].t3_mono_ns) / 2 for i in best]
    wall = [samples[i].t1_wall_ns - (samples[i].t0_wall_ns + samples[i].t3_wall_ns) / 2 for i in best]
    return LatencyResult(offset_mono_ns=int(round(float(np.median(mono)))),
                         offset_wall_ns=int(round(float(np.median(wall)))),
                         bound_ms=float(np.max(rtt[best])) / 2e6, rtt_ms=percentiles_ms(rtt, with_min=True),
                         samples=len(samples))


def ping_samples(client, count: int = 200, interval_s: float = 0.005, timeout_s: float = 1.0) -> list[PingSample]:
    """``count`` pings through a ``robot_io.client.DeviceClient``, each stamped on both clocks."""
    out = []
    for _ in range(count):
        t0w = time.time_ns()
        t0 = time.monotonic_ns()
        reply = client.request("ping", timeout_s=timeout_s)
        t3 = time.monotonic_ns()
        t3w = time.time_ns()
        # the request's own stamp, echoed by the device, is the exact send time on our clock
        t0 = int(reply.get("echo_t_mono_ns", t0))
        out.append(PingSample(t0, int(reply.t_mono_ns), t3, t0w, int(reply.t_wall_ns), t3w))
        if interval_s > 0:
            time.sleep(interval_s)
    return out


def stream_delays_ns(reader, offset_mono_ns: int, count: int = 50, timeout_s: float = 2.0) -> list[int]:
    """Delay of ``count`` messages of a ``robot_io.client.StreamReader`` (mode ``record``):
    host receive time minus the device's stamp mapped onto the host clock."""
    out = []
    deadline = time.monotonic() + timeout_s + count * 0.5
    while len(out) < count and time.monotonic() < deadline:
        msg = reader.next(timeout_s)
        if msg is None:
            break
        # a state message's header stamp is the measurement time; a frame's is its capture time
        t_dev = int(msg.get("state_t_mono_ns", msg.t_mono_ns))
        out.append(int(msg["recv_t_mono_ns"]) - (t_dev - offset_mono_ns))
    return out


def measure(client, reader=None, count: int = 200, stream_count: int = 50, interval_s: float = 0.005
            ) -> LatencyResult:
    """Ping ``client`` ``count`` times for the offsets; with a ``reader`` on the device's stream
    also the stream delay over ``stream_count`` messages."""
    res = offset_from_samples(ping_samples(client, count=count, interval_s=interval_s))
    if reader is not None:
        delays = stream_delays_ns(reader, res.offset_mono_ns, count=stream_count)
        if delays:
            res.stream_delay_ms = percentiles_ms(delays)
    return res
