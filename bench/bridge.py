#!/usr/bin/env python
"""Bridge benchmark: the robot_io ZMQ bridge against raw pyzmq on the same sockets (tcp loopback).

Run ``.venv/bin/python -m bench.bridge [--quick] [--out DIR]``. It writes ``DIR/bridge.json``
and ``DIR/bridge.png`` (default DIR: bench/results) and prints a table. Two measurements, both
in this one run:

1. **Command round trip.** ``DeviceClient.request("ee_delta")`` -> ``DeviceServer(ArmService)``
   -> reply, against raw pyzmq REQ/REP moving byte strings of exactly the bridge's request and
   reply frame sizes. Each server runs in its own (spawned) process, so client and server do not
   share a GIL; the client is this process. Bridge and raw samples are taken in alternating
   blocks, so a slow patch of the machine hits both. The arm is :class:`NullArm`, a
   transport-only device whose methods are instant bookkeeping: what is measured is the bridge
   (encode, socket, decode, validation, limits, reply), not any physics. When
   ``hardware.sim_franka`` imports, one extra row puts the real-time MuJoCo Franka behind the
   same bridge (labelled as such; it includes the simulator's lock and forward kinematics).
   Where the bridge's extra time goes: ``rtt.cpu_breakdown_us`` times each software step of one
   round trip (encode, decode, validation, limits, reply) in a hot loop in this process.
2. **Camera streams.** 3 cameras (``SyntheticCamera``, 640x480 RGB at 30 fps), each behind its
   own ``DeviceServer(CameraService)`` with its own PUB socket, all in one server process. This
   process subscribes with, per camera, one latest-only and one record-mode ``StreamReader``.
   The frame age is ``msg.meta['recv_t_mono_ns']`` (stamped by the reader thread *after* the
   message came out of the socket and was decoded) minus ``msg.t_mono_ns`` (stamped by the
   camera when the frame was made, before encode and send), so it includes the server's encode
   and send, the socket, the client's receive and decode. Both stamps are CLOCK_MONOTONIC on one
   machine. The comparison is raw pyzmq PUB/SUB from the same SyntheticCamera frames (same
   sizes, rate, socket options), with a 16-byte struct header instead of msgpack, read by the
   same number of SUB sockets and threads.

   The phase between the cameras matters as much as the software: ``aligned`` (the cameras
   capture at the same instants, like hardware-synchronised cameras; three 0.9 MB frames then
   queue behind each other, the worst case) and ``spread`` (phases spread evenly over the frame
   period, like free-running cameras). Full mode measures both, quick mode only ``aligned``.

   Losses are counted against the servers' own send counters: after the measured window the
   client asks each server how many frames it has handed to its PUB socket (P, which is also
   the last sequence number sent), waits for frames in flight, and counts the frames with
   first_seq <= seq <= P that the recorder reader delivered. ``sent = P - first_seq + 1``
   (frames published before the subscription was live are not counted: PUB/SUB drops them by
   design). ``lost = sent - delivered``; the reader's own gap counter (``reader.lost``) and queue
   overflow (``reader.overflow``) are reported beside it.

Goals: command RTT bridge/raw <= 1.25 at p50 and p99; camera frame age p99 <= 5 ms; 0 frames
lost by the recorder readers (delivered == sent), judged per camera phase. The JSON records
each goal with its value and met / not met; nothing is tuned to meet them. Quick mode (~12 s)
is for the test suite; its figures are noisier. Full mode takes about a minute.
"""

from __future__ import annotations

import datetime as _dt
import gc
import multiprocessing as mp
import os
import pathlib
import platform
import signal
import struct
import sys
import threading
import time

import msgpack
import numpy as np
import zmq

from hardware.null_arm import NullArm
from hardware.synthetic_camera import SyntheticCamera
from robot_io.client import BridgeTimeout, DeviceClient, StreamReader
from robot_io.server import ArmService, CameraService, DeviceServer
from robot_io.wire import Message, decode, encode

from bench.harness import flags, plots
from bench.harness.results import write_result


GOAL_RTT_RATIO = 1.25
GOAL_AGE_P99_MS = 5.0
GOAL_LOST = 0
CHILD_MAX_LIFETIME_S = 300.0  # a server process never outlives this, whatever happens to its parent


# ------------------------------------------------------------------------------------------
# A transport-only arm
# ------------------------------------------------------------------------------------------


class PhasedSyntheticCamera(SyntheticCamera):
    """A SyntheticCamera whose first frame is due at ``first_frame_t`` (time.monotonic()), so the
    bridge and the raw runs have the same phases between cameras. Left alone, each camera's
    schedule starts when it is connected, i.e. at whatever moment each server happened to start,
    and the overlap of the three 0.9 MB frames (which changes the age) would differ by chance."""

    def __init__(self, name: str, width: int, height: int, fps: float, first_frame_t: float) -> None:
        super().__init__(name, width, height, fps)
        self.first_frame_t = first_frame_t

    def _connect(self) -> None:
        super()._connect()
        self._next_t = max(self.first_frame_t, time.monotonic())


# ------------------------------------------------------------------------------------------
# Server processes (spawned; top-level functions so spawn can import them)
# ------------------------------------------------------------------------------------------


def _wait_for(conn, deadline: float):
    """Next control message from the parent, or None when the parent is gone / time is up."""
    while time.monotonic() < deadline:
        try:
            if conn.poll(0.2):
                return conn.recv()
        except (EOFError, OSError):
            return None
    return None


def _arm_server_proc(conn, kind: str) -> None:
    deadline = time.monotonic() + CHILD_MAX_LIFETIME_S
    try:
        if kind == "null":
            arm = NullArm("arm")
        else:  # "sim": the real-time MuJoCo Franka
            from hardware.sim_franka import SimFranka
            arm = SimFranka("arm", realtime=True)
        srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", None)
        srv.start()
    except BaseException as e:  # report, do not hang the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})
        return
    conn.send({"endpoint": srv.command_endpoint, "describe": srv.service.describe()})
    while True:
        m = _wait_for(conn, deadline)
        if m == "stats":
            conn.send({**srv.stats, "cpu_s": time.process_time()})
            continue
        break
    stats = {**srv.stats, "cpu_s": time.process_time()}
    srv.stop()
    try:
        conn.send(stats)
    except (BrokenPipeError, OSError) as e:  # the parent is gone (it timed out): nobody to tell
        print(f"server process: could not report to the benchmark: {e}", file=sys.stderr)


def _raw_rep_proc(conn, reply_sizes: list[int]) -> None:
    """Raw pyzmq REP: answers each request with frames of the bridge reply's sizes."""
    deadline = time.monotonic() + CHILD_MAX_LIFETIME_S
    ctx = zmq.Context()
    s = ctx.socket(zmq.REP)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 200)  # only to notice the stop request; a waiting message returns at once
    port = s.bind_to_random_port("tcp://127.0.0.1")
    reply = [bytes(n) for n in reply_sizes]
    conn.send({"endpoint": f"tcp://127.0.0.1:{port}"})
    served = 0
    while time.monotonic() < deadline:
        try:
            frames = s.recv_multipart()
        except zmq.Again:  # idle: is the parent asking us to stop (or gone)?
            try:
                if conn.poll(0):
                    conn.recv()
                    break
            except (EOFError, OSError):
                break
            continue
        s.send_multipart(reply)
        served += 1
    s.close(linger=0)
    ctx.term()
    try:
        conn.send({"served": served, "cpu_s": time.process_time()})
    except (BrokenPipeError, OSError) as e:  # the parent is gone (it timed out): nobody to tell
        print(f"server process: could not report to the benchmark: {e}", file=sys.stderr)


def _camera_server_proc(conn, kind: str, n_cams: int, width: int, height: int, fps: float, hwm: int,
                       phase: str, io_threads: int = 1) -> None:
    """``bridge``: one DeviceServer(CameraService(SyntheticCamera)) per camera.
    ``raw``: one PUB socket and thread per camera sending the same SyntheticCamera frames with a
    16-byte struct header (seq, capture t_mono_ns), zero-copy, same SNDHWM.
    ``phase``: ``aligned`` -- all cameras capture at the same instants (hardware-synchronised
    cameras; the worst case, three frames queue behind each other); ``spread`` -- phases evenly
    spread over the frame period (free-running cameras, best case)."""
    deadline = time.monotonic() + CHILD_MAX_LIFETIME_S
    zmq.Context.instance(io_threads=io_threads)  # the context both kinds use
    t0 = time.monotonic() + 0.3  # after every server has started
    step = 0.0 if phase == "aligned" else 1.0 / fps / n_cams
    cams = [PhasedSyntheticCamera(f"cam{i}", width, height, fps, t0 + i * step) for i in range(n_cams)]
    if kind == "bridge":
        servers = [DeviceServer(CameraService(c.name, c), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                                stream_hwm=hwm).start() for c in cams]
        conn.send({"endpoints": [s.stream_endpoint for s in servers]})

        def published():
            return [s.stats["published"] for s in servers]

        def errors():
            return [repr(s.stream_error) if s.stream_error else None for s in servers]

        def shutdown():
            for s in servers:
                s.stop()
    else:
        ctx = zmq.Context.instance()
        stop = threading.Event()
        counts = [0] * n_cams
        errs: list = [None] * n_cams
        socks, eps = [], []
        for _ in cams:
            p = ctx.socket(zmq.PUB)
            p.setsockopt(zmq.LINGER, 0)
            p.setsockopt(zmq.SNDHWM, hwm)
            port = p.bind_to_random_port("tcp://127.0.0.1")
            socks.append(p)
            eps.append(f"tcp://127.0.0.1:{port}")

        def run(i):
            cam, pub = cams[i], socks[i]
            try:
                with cam:
                    seq = 0
                    while not stop.is_set():
                        f = cam.read(timeout_s=1.0)
                        seq += 1
                        pub.send_multipart([struct.pack("<qq", seq, f.t_mono_ns), memoryview(f.rgb)], copy=False)
                        counts[i] += 1
            except BaseException as e:
                errs[i] = repr(e)
            finally:
                pub.close(linger=0)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n_cams)]
        for t in threads:
            t.start()
        conn.send({"endpoints": eps})

        def published():
            return list(counts)

        def errors():
            return list(errs)

        def shutdown():
            stop.set()
            for t in threads:
                t.join(timeout=3)

    while True:
        m = _wait_for(conn, deadline)
        if m == "stats":
            conn.send({"published": published(), "cpu_s": time.process_time(), "errors": errors()})
            continue
        break
    final = {"published": published(), "cpu_s": time.process_time(), "errors": errors()}
    shutdown()
    try:
        conn.send(final)
    except (BrokenPipeError, OSError) as e:  # the parent is gone (it timed out): nobody to tell
        print(f"server process: could not report to the benchmark: {e}", file=sys.stderr)


class Child:
    """A spawned server process with a control pipe. ``info`` (its first message) waits for it."""

    def __init__(self, target, *args, start_timeout_s: float = 60.0) -> None:
        ctx = mp.get_context("spawn")
        self.name, self.start_timeout_s = target.__name__, start_timeout_s
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child_conn, *args), daemon=True)
        self.proc.start()
        child_conn.close()
        self._info: dict | None = None

    @property
    def info(self) -> dict:
        if self._info is None:
            if not self.conn.poll(self.start_timeout_s):
                self.kill()
                raise RuntimeError(f"{self.name}: server process did not start within {self.start_timeout_s} s")
            self._info = self.conn.recv()
        return self._info

    def ask(self, what: str, timeout_s: float = 10.0) -> dict:
        self.conn.send(what)
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"server process did not answer {what!r} within {timeout_s} s")
        return self.conn.recv()

    def stop(self, timeout_s: float = 10.0) -> dict:
        try:
            self.info  # noqa: B018  (its first message must be read before the stop reply)
            out = self.ask("stop", timeout_s)
        finally:
            self.proc.join(timeout_s)
            self.kill()
        return out

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


# ------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------


def _summary(values, scale: float) -> dict:
    a = np.asarray(values, np.float64) * scale
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())}


# ------------------------------------------------------------------------------------------
# 1. Command round trip
# ------------------------------------------------------------------------------------------


def _actions():
    a = np.array([0.001, -0.001, 0.001, 0.0, 0.0, 0.01, 0.5], np.float32)
    return [a, -a * np.array([1, 1, 1, 1, 1, 1, -1], np.float32)]  # back and forth, gripper stays 0.5


def _wire_sizes() -> tuple[list[int], list[int]]:
    """Frame sizes of one encoded ee_delta request and of the ArmService reply to it."""
    req = Message("ee_delta", "arm", {"action": _actions()[0]},
                  {"req_id": f"{os.getpid()}-1000", "deadline_ns": time.monotonic_ns() + 10**9},
                  seq=1000, t_mono_ns=time.monotonic_ns())
    req_frames = [bytes(f) for f in encode(req)]
    svc = ArmService("arm", NullArm())
    svc.open()
    arrays, meta = svc.handle(decode(req_frames))
    rep = Message("reply", "arm", arrays, {"req_id": req.meta["req_id"], **meta}, seq=1000)
    return [len(f) for f in req_frames], [len(bytes(f)) for f in encode(rep)]


def _bridge_block(client: DeviceClient, n: int, out: list[int]) -> None:
    client.request("reset")  # re-arm: the watchdog trips while the other side's block runs
    acts = _actions()
    for i in range(n):
        arrays = {"action": acts[i & 1]}
        t0 = time.perf_counter_ns()
        client.request("ee_delta", arrays)
        out.append(time.perf_counter_ns() - t0)


def _ping_block(client: DeviceClient, n: int, out: list[int]) -> None:
    for _ in range(n):
        t0 = time.perf_counter_ns()
        client.request("ping")
        out.append(time.perf_counter_ns() - t0)


def _raw_block(sock: zmq.Socket, frames: list[bytes], n: int, out: list[int]) -> None:
    for _ in range(n):
        t0 = time.perf_counter_ns()
        sock.send_multipart(frames)
        if not sock.poll(2000):
            raise RuntimeError("raw REP server did not answer within 2 s")
        sock.recv_multipart()
        out.append(time.perf_counter_ns() - t0)


def bench_rtt(n: int, warmup: int, block: int, n_sim: int, with_sim: bool) -> dict:
    req_sizes, rep_sizes = _wire_sizes()
    bridge_srv = Child(_arm_server_proc, "null")
    raw_srv = Child(_raw_rep_proc, rep_sizes)
    if "error" in bridge_srv.info:
        raise RuntimeError(f"bridge arm server failed: {bridge_srv.info['error']}")
    client = DeviceClient(bridge_srv.info["endpoint"], "arm", timeout_s=2.0)
    raw = zmq.Context.instance().socket(zmq.REQ)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(raw_srv.info["endpoint"])
    raw_frames = [bytes(k) for k in req_sizes]
    bridge_ns: list[int] = []
    raw_ns: list[int] = []
    ping_ns: list[int] = []
    try:
        _bridge_block(client, warmup, [])
        _raw_block(raw, raw_frames, warmup, [])
        _ping_block(client, warmup, [])
        done = 0
        while done < n:  # alternating blocks: machine noise hits all sides alike
            k = min(block, n - done)
            _bridge_block(client, k, bridge_ns)
            _raw_block(raw, raw_frames, k, raw_ns)
            _ping_block(client, k, ping_ns)
            done += k
    finally:
        client.close()
        raw.close(linger=0)
        bridge_stats = bridge_srv.stop()
        raw_stats = raw_srv.stop()
    b, r, pg = _summary(bridge_ns, 1e-3), _summary(raw_ns, 1e-3), _summary(ping_ns, 1e-3)
    out = {
        "unit": "us",
        "request_frame_bytes": req_sizes, "reply_frame_bytes": rep_sizes,
        "bridge": {**b, "label": "DeviceClient -> DeviceServer(ArmService(NullArm)) ee_delta",
                   "server_commands": bridge_stats.get("commands"), "server_errors": bridge_stats.get("errors")},
        "raw": {**r, "label": "raw pyzmq REQ/REP, same frame sizes", "server_served": raw_stats.get("served")},
        "bridge_ping": {**pg, "label": "DeviceClient.request('ping') through the same server: the bridge's "
                        "wire and sockets without the arm service (reference row, not a goal)",
                        "ratio_p50_to_raw": pg["p50"] / r["p50"], "ratio_p99_to_raw": pg["p99"] / r["p99"]},
        "ratio_p50": b["p50"] / r["p50"], "ratio_p99": b["p99"] / r["p99"], "ratio_mean": b["mean"] / r["mean"],
        "samples_us": {"bridge": np.round(np.asarray(bridge_ns) / 1e3, 1).tolist(),
                       "raw": np.round(np.asarray(raw_ns) / 1e3, 1).tolist(),
                       "bridge_ping": np.round(np.asarray(ping_ns) / 1e3, 1).tolist()},
    }
    out["cpu_breakdown_us"] = cpu_breakdown(reps=max(100, n // 10))
    out["sim_franka"] = bench_rtt_sim(n_sim, warmup) if with_sim else {"skipped": "disabled with --no-sim"}
    return out


def cpu_breakdown(reps: int, rounds: int = 7) -> dict:
    """Where the bridge's extra time goes: the CPU cost of each software step of one ee_delta
    round trip, measured in this process in a hot loop (best of ``rounds`` interleaved loops of
    ``reps``: the least disturbed by the machine's noise).
    In situ (two processes taking turns on the cores, cold caches after each wake-up) the same
    steps cost more, so the sum is a lower bound of the bridge's overhead over raw pyzmq."""
    svc = ArmService("arm", NullArm())
    svc.open()
    srv = DeviceServer(svc, "tcp://127.0.0.1:*")  # never started: only its message handling is used
    action = _actions()[0]
    far = time.monotonic_ns() + 10**15

    def request():
        return Message("ee_delta", "arm", {"action": action}, {"req_id": f"{os.getpid()}-1", "deadline_ns": far},
                       seq=1, t_mono_ns=time.monotonic_ns())

    req_frames = [bytes(f) for f in encode(request())]
    req_msg = decode(req_frames)
    reply = srv._handle_frames(req_frames)
    if reply.type != "reply":
        raise RuntimeError(f"breakdown: the server refused the sample command: {reply.meta}")
    rep_frames = [bytes(f) for f in encode(reply)]
    steps = {
        "client: build + encode request": lambda: encode(request()),
        "server: decode request": lambda: decode(req_frames),
        "server: ArmService.handle (check, limits, quaternions)": lambda: svc.handle(req_msg),
        "server: _handle_frames (decode + checks + handle)": lambda: srv._handle_frames(req_frames),
        "server: encode reply": lambda: encode(reply),
        "client: decode reply": lambda: decode(rep_frames),
    }
    per: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():
        fn()
    for _ in range(rounds):  # the steps take turns, so a slow patch of the machine hits all of them
        for name, fn in steps.items():
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                fn()
            per[name].append((time.perf_counter_ns() - t0) / reps / 1e3)
    out = {name: float(min(v)) for name, v in per.items()}
    svc.close()
    out["total per round trip (client encode + _handle_frames + reply encode + client decode)"] = (
        out["client: build + encode request"] + out["server: _handle_frames (decode + checks + handle)"]
        + out["server: encode reply"] + out["client: decode reply"])
    return out


def bench_rtt_sim(n: int, warmup: int) -> dict:
    """Extra row: the real-time MuJoCo Franka (hardware.sim_franka) behind the same bridge."""
    try:
        import hardware.sim_franka  # noqa: F401  (fail here, cheaply, rather than in the child)
    except Exception as e:
        note = f"hardware.sim_franka does not import ({type(e).__name__}: {e}); row skipped"
        print(f"note: {note}")
        return {"skipped": note}
    try:
        srv = Child(_arm_server_proc, "sim")
    except Exception as e:
        note = f"SimFranka server failed to start ({e}); row skipped"
        print(f"note: {note}")
        return {"skipped": note}
    if "error" in srv.info:
        srv.kill()
        note = f"SimFranka server failed: {srv.info['error']}; row skipped"
        print(f"note: {note}")
        return {"skipped": note}
    client = DeviceClient(srv.info["endpoint"], "arm", timeout_s=2.0)
    ns: list[int] = []
    try:
        _bridge_block(client, warmup, [])
        _bridge_block(client, n, ns)
    finally:
        client.close()
        stats = srv.stop()
    return {**_summary(ns, 1e-3), "label": "DeviceClient -> DeviceServer(ArmService(SimFranka realtime=True)) "
            "ee_delta: includes the simulator's physics-thread lock and forward kinematics",
            "server_errors": stats.get("errors"), "samples_us": np.round(np.asarray(ns) / 1e3, 1).tolist()}


# ------------------------------------------------------------------------------------------
# 2. Camera streams
# ------------------------------------------------------------------------------------------


class _BridgeSubscribers:
    """Per camera: one record-mode and one latest-only StreamReader; one consumer thread drains
    the recorders (keeping only timestamps) and samples the latest-only readers."""

    def __init__(self, endpoints: list[str]) -> None:
        self.rec = [StreamReader(ep, "record", name=f"rec{i}") for i, ep in enumerate(endpoints)]
        self.lat = [StreamReader(ep, "latest", name=f"lat{i}") for i, ep in enumerate(endpoints)]
        self.rec_rows: list[list[tuple[int, int, int]]] = [[] for _ in endpoints]  # (seq, t_capture, t_recv)
        self.lat_rows: list[list[tuple[int, int, int]]] = [[] for _ in endpoints]
        self.bad_pixels = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._consume, daemon=True, name="bench-consumer")
        self._thread.start()

    def _drain(self) -> None:
        for i, r in enumerate(self.rec):
            for _ in range(1000):  # bounded drain
                m = r.next(timeout_s=0)
                if m is None:
                    break
                if int.from_bytes(bytes(m.arrays["rgb"][0, :8, 0]), "little") != m["index"]:
                    self.bad_pixels += 1
                self.rec_rows[i].append((m.seq, m.t_mono_ns, m.meta["recv_t_mono_ns"]))

    def _consume(self) -> None:
        last = [0] * len(self.lat)
        while not self._stop.is_set():
            self._drain()
            for i, r in enumerate(self.lat):
                try:
                    m = r.latest(timeout_s=0, newer_than_ns=last[i])
                except BridgeTimeout:
                    continue
                last[i] = m.t_mono_ns
                self.lat_rows[i].append((m.seq, m.t_mono_ns, m.meta["recv_t_mono_ns"]))
            self._stop.wait(0.005)

    def ready(self) -> bool:
        return all(rows for rows in self.rec_rows)

    def counters(self) -> dict:
        return {"reader_lost": [r.lost for r in self.rec], "reader_overflow": [r.overflow for r in self.rec],
                "decode_errors": [r.decode_errors for r in self.rec + self.lat],
                "latest_received": [r.received for r in self.lat], "bad_pixels": self.bad_pixels}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for r in self.rec + self.lat:
            r.close()
        self._drain()  # whatever the recorders queued after the consumer's last pass


class _RawSubscribers:
    """Raw pyzmq mirror of _BridgeSubscribers: per camera a record SUB (RCVHWM 1000) and a
    latest SUB (RCVHWM 2), each read by its own thread that stamps receive time after parsing."""

    def __init__(self, endpoints: list[str]) -> None:
        self.ctx = zmq.Context.instance()
        self.rec_rows: list[list[tuple[int, int, int]]] = [[] for _ in endpoints]
        self.lat_rows: list[list[tuple[int, int, int]]] = [[] for _ in endpoints]
        self.reader_lost = [0] * len(endpoints)
        self.latest_received = [0] * len(endpoints)
        self.bad_sizes = 0
        self.frame_bytes: int | None = None
        self._stop = threading.Event()
        self._threads = []
        ready = []
        for i, ep in enumerate(endpoints):
            for mode in ("record", "latest"):
                ev = threading.Event()
                ready.append(ev)
                t = threading.Thread(target=self._run, args=(ep, i, mode, ev), daemon=True)
                t.start()
                self._threads.append(t)
        for ev in ready:
            ev.wait(2.0)

    def _run(self, ep: str, i: int, mode: str, ready: threading.Event) -> None:
        s = self.ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 1000 if mode == "record" else 2)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(ep)
        ready.set()
        rows = self.rec_rows[i] if mode == "record" else self.lat_rows[i]
        last_seq = None
        try:
            while not self._stop.is_set():
                if not s.poll(50):
                    continue
                frames = s.recv_multipart(copy=False)
                seq, t_cap = struct.unpack("<qq", frames[0].bytes)
                n = len(frames[1])
                t_recv = time.monotonic_ns()
                if self.frame_bytes is None:
                    self.frame_bytes = n
                elif n != self.frame_bytes:
                    self.bad_sizes += 1
                if mode == "record":
                    if last_seq is not None and seq > last_seq + 1:
                        self.reader_lost[i] += seq - last_seq - 1
                    last_seq = seq
                else:
                    self.latest_received[i] += 1
                rows.append((seq, t_cap, t_recv))
        finally:
            s.close(linger=0)

    def ready(self) -> bool:
        return all(rows for rows in self.rec_rows)

    def counters(self) -> dict:
        return {"reader_lost": list(self.reader_lost), "reader_overflow": [0] * len(self.reader_lost),
                "latest_received": list(self.latest_received), "bad_sizes": self.bad_sizes}

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)


def bench_cameras(kind: str, n_cams: int, width: int, height: int, fps: float, seconds: float,
                  hwm: int = 100, phase: str = "aligned", io_threads: int = 1) -> dict:
    srv = Child(_camera_server_proc, kind, n_cams, width, height, fps, hwm, phase, io_threads)
    eps = srv.info["endpoints"]
    subs = _BridgeSubscribers(eps) if kind == "bridge" else _RawSubscribers(eps)
    try:
        t_wait = time.monotonic() + 10.0
        while not subs.ready():  # every recorder subscription is live
            if time.monotonic() > t_wait:
                raise RuntimeError(f"{kind} cameras: no frame on every recorder within 10 s")
            time.sleep(0.01)
        srv_before = srv.ask("stats")
        cpu0, t0 = time.process_time(), time.monotonic()
        time.sleep(seconds)
        srv_after = srv.ask("stats")  # P_i: frames handed to each PUB socket so far
        elapsed = time.monotonic() - t0
        cpu_client = time.process_time() - cpu0
        time.sleep(0.3)  # frames in flight (a frame takes ~1 ms; 0.3 s is ample)
        counters = subs.counters()
    finally:
        subs.close()
        final = srv.stop()
    per_cam, all_ages, lat_ages = [], [], []
    for i in range(n_cams):
        rows = np.asarray(subs.rec_rows[i], np.int64).reshape(-1, 3)
        p = int(srv_after["published"][i])
        first_seq = int(rows[0, 0])
        rows = rows[rows[:, 0] <= p]
        sent = p - first_seq + 1
        delivered = int(len(np.unique(rows[:, 0])))
        ages_ms = (rows[:, 2] - rows[:, 1]) / 1e6
        span_s = (rows[-1, 2] - rows[0, 2]) / 1e9 if len(rows) > 1 else float("nan")
        lrows = np.asarray(subs.lat_rows[i], np.int64).reshape(-1, 3)
        lrows = lrows[(lrows[:, 0] >= first_seq) & (lrows[:, 0] <= p)]  # the recorder's window
        l_ages = (lrows[:, 2] - lrows[:, 1]) / 1e6
        all_ages.append(ages_ms)
        lat_ages.append(l_ages)
        per_cam.append({
            "camera": f"cam{i}", "sent": sent, "delivered": delivered, "lost": sent - delivered,
            "reader_lost": counters["reader_lost"][i], "reader_overflow": counters["reader_overflow"][i],
            "delivered_fps": (delivered - 1) / span_s if delivered > 1 else 0.0,
            "age_ms": _summary(ages_ms, 1.0),
            "latest_reader": {"received": counters["latest_received"][i], "sampled": int(len(lrows)),
                              "age_ms": _summary(l_ages, 1.0)},
            "server_published_total": int(final["published"][i]),
        })
    ages = np.concatenate(all_ages)
    sent = sum(c["sent"] for c in per_cam)
    delivered = sum(c["delivered"] for c in per_cam)
    lost = sum(c["lost"] for c in per_cam)
    reader_losses = sum(c["reader_lost"] + c["reader_overflow"] for c in per_cam)
    overall = {
        "sent": sent, "delivered": delivered, "lost": lost, "reader_lost_plus_overflow": reader_losses,
        "delivered_equals_sent": delivered == sent,
        "delivered_fps_per_camera_mean": float(np.mean([c["delivered_fps"] for c in per_cam])),
        "delivered_fps_total": float(sum(c["delivered_fps"] for c in per_cam)),
        "server_published_in_window": int(sum(srv_after["published"]) - sum(srv_before["published"])),
        "server_fps_in_window": (sum(srv_after["published"]) - sum(srv_before["published"])) / elapsed,
        "age_ms": _summary(ages, 1.0),
        "latest_age_ms": _summary(np.concatenate(lat_ages), 1.0),
        "client_cpu_fraction": cpu_client / elapsed,
        "server_cpu_fraction": (srv_after["cpu_s"] - srv_before["cpu_s"]) / elapsed,
        "server_errors": [e for e in final["errors"] if e],
    }
    out = {"per_camera": per_cam, "overall": overall, "window_s": elapsed,
           "counters": {k: v for k, v in counters.items() if k not in ("reader_lost", "reader_overflow")},
           "ages_ms": np.round(ages, 4).tolist()}
    return out


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------


def machine_info() -> dict:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "python": sys.version.split()[0],
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(), "msgpack": ".".join(map(str, msgpack.version)),
            "numpy": np.__version__, "loadavg_at_end": list(os.getloadavg())}


def goals(rtt: dict, cams: dict) -> dict:
    """Goals, each with its measured value and met / not met. Camera goals are judged per camera
    phase measured (``cams`` maps phase -> {bridge, raw}), on the bridge's recorder readers."""
    out = {
        "rtt_ratio_p50": {"target": f"<= {GOAL_RTT_RATIO}", "value": rtt["ratio_p50"],
                          "met": bool(rtt["ratio_p50"] <= GOAL_RTT_RATIO)},
        "rtt_ratio_p99": {"target": f"<= {GOAL_RTT_RATIO}", "value": rtt["ratio_p99"],
                          "met": bool(rtt["ratio_p99"] <= GOAL_RTT_RATIO)},
    }
    for phase, c in cams.items():
        bo = c["bridge"]["overall"]
        out[f"camera_age_p99_ms[{phase}]"] = {"target": f"<= {GOAL_AGE_P99_MS}", "value": bo["age_ms"]["p99"],
                                              "met": bool(bo["age_ms"]["p99"] <= GOAL_AGE_P99_MS)}
        out[f"camera_lost[{phase}]"] = {"target": f"== {GOAL_LOST}",
                                        "value": bo["lost"] + bo["reader_lost_plus_overflow"],
                                        "met": bool(bo["lost"] == 0 and bo["reader_lost_plus_overflow"] == 0)}
        out[f"camera_delivered_equals_sent[{phase}]"] = {"target": "delivered == sent",
                                                         "value": [bo["delivered"], bo["sent"]],
                                                         "met": bool(bo["delivered_equals_sent"])}
    return out


def print_table(res: dict) -> None:
    rtt, cfg = res["rtt"], res["config"]
    print(f"\nCommand round trip (ee_delta, tcp loopback, server in its own process), N = {rtt['bridge']['n']} each")
    print(f"  {'':34s} {'p50 us':>9s} {'p99 us':>9s} {'mean us':>9s} {'max us':>9s}")
    rows = [("bridge ee_delta (NullArm)", rtt["bridge"]), ("raw pyzmq REQ/REP", rtt["raw"]),
            ("bridge ping (no arm service)", rtt["bridge_ping"])]
    if "p50" in rtt.get("sim_franka", {}):
        rows.append((f"bridge ee_delta (SimFranka rt) N={rtt['sim_franka']['n']}", rtt["sim_franka"]))
    for name, s in rows:
        print(f"  {name:34s} {s['p50']:9.1f} {s['p99']:9.1f} {s['mean']:9.1f} {s['max']:9.1f}")
    print(f"  {'ratio ee_delta(NullArm)/raw':34s} {rtt['ratio_p50']:9.2f} {rtt['ratio_p99']:9.2f} "
          f"{rtt['ratio_mean']:9.2f}")
    print(f"  {'ratio ping/raw (reference)':34s} {rtt['bridge_ping']['ratio_p50_to_raw']:9.2f} "
          f"{rtt['bridge_ping']['ratio_p99_to_raw']:9.2f}")
    if "skipped" in rtt.get("sim_franka", {}):
        print(f"  (SimFranka row skipped: {rtt['sim_franka']['skipped']})")
    print("  bridge software cost per step (in-process hot loop, best of 7, us; in situ it is higher):")
    for k, v in rtt["cpu_breakdown_us"].items():
        print(f"    {k:84s} {v:7.1f}")
    for phase, cams in res["cameras"].items():
        print(f"\nCameras: {cfg['cameras']} x {cfg['width']}x{cfg['height']} RGB @ {cfg['fps']:g} fps, "
              f"{cfg['camera_seconds']:g} s window, phases {phase}; recorder readers (every frame)")
        print(f"  {'':14s} {'sent':>6s} {'deliv':>6s} {'lost':>5s} {'gap+ovf':>7s} {'fps':>6s} "
              f"{'age p50':>8s} {'age p99':>8s} {'age max':>8s}  (ms)")
        for kind in ("bridge", "raw"):
            c = cams[kind]
            for pc in c["per_camera"]:
                a = pc["age_ms"]
                print(f"  {kind + ' ' + pc['camera']:14s} {pc['sent']:6d} {pc['delivered']:6d} {pc['lost']:5d} "
                      f"{pc['reader_lost'] + pc['reader_overflow']:7d} {pc['delivered_fps']:6.2f} "
                      f"{a['p50']:8.2f} {a['p99']:8.2f} {a['max']:8.2f}")
            o, a = c["overall"], c["overall"]["age_ms"]
            print(f"  {kind + ' all':14s} {o['sent']:6d} {o['delivered']:6d} {o['lost']:5d} "
                  f"{o['reader_lost_plus_overflow']:7d} {o['delivered_fps_total']:6.2f} "
                  f"{a['p50']:8.2f} {a['p99']:8.2f} {a['max']:8.2f}   client CPU "
                  f"{100 * o['client_cpu_fraction']:.0f}%, server CPU {100 * o['server_cpu_fraction']:.0f}%")
            la = o["latest_age_ms"]
            if la.get("n"):
                print(f"  {kind + ' latest':14s} (latest-only readers) {la['n']} frames sampled, age p50 "
                      f"{la['p50']:.2f} p99 {la['p99']:.2f} max {la['max']:.2f} ms")
    print("\nGoals")
    for k, g in res["goals"].items():
        v = g["value"]
        vs = f"{v:.3f}" if isinstance(v, float) else str(v)
        print(f"  {k:38s} {g['target']:>18s}  value {vs:>14s}  {'MET' if g['met'] else 'NOT MET'}")


def _log_axis(ax, ticks) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ax.xaxis.set_major_locator(FixedLocator([t for t in ticks if lo <= t <= hi] or ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot(res: dict, path: pathlib.Path) -> None:
    plt = plots.pyplot()

    rtt, cams = res["rtt"], res["cameras"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6.2))

    def cdf(ax, vals, label, **kw):
        v = np.sort(np.asarray(vals))
        if v.size:
            ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label, **kw)

    s = rtt["samples_us"]
    b = rtt["bridge"]
    cdf(ax1, s["bridge"], f"bridge ee_delta, NullArm (p50 {b['p50']:.0f}, p99 {b['p99']:.0f} us)", color="tab:blue")
    cdf(ax1, s["raw"], f"raw pyzmq REQ/REP (p50 {rtt['raw']['p50']:.0f}, p99 {rtt['raw']['p99']:.0f} us)",
        color="tab:orange")
    pg = rtt["bridge_ping"]
    cdf(ax1, s["bridge_ping"], f"bridge ping, no arm service (p50 {pg['p50']:.0f}, p99 {pg['p99']:.0f} us)",
        linestyle=":", color="tab:blue")
    if "samples_us" in rtt.get("sim_franka", {}):
        sf = rtt["sim_franka"]
        cdf(ax1, sf["samples_us"], f"bridge ee_delta, SimFranka realtime (p50 {sf['p50']:.0f}, "
            f"p99 {sf['p99']:.0f} us)", linestyle="--", color="tab:green")
    _log_axis(ax1, [50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000])
    ax1.set_xlabel("round trip (us, log scale)")
    ax1.set_ylabel("fraction of commands")
    ax1.set_title(f"ee_delta command RTT: bridge/raw p50 x{rtt['ratio_p50']:.2f}, p99 x{rtt['ratio_p99']:.2f} "
                  f"(goal <= {GOAL_RTT_RATIO})", fontsize=10)
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)

    cfg = res["config"]
    colors = {"bridge": "tab:blue", "raw": "tab:orange"}
    styles = {"aligned": "-", "spread": "--"}
    for phase, c in cams.items():
        for kind in ("bridge", "raw"):
            o = c[kind]["overall"]
            cdf(ax2, c[kind]["ages_ms"], f"{kind}, {phase} (p50 {o['age_ms']['p50']:.2f}, p99 "
                f"{o['age_ms']['p99']:.2f} ms, lost {o['lost']})", color=colors[kind], linestyle=styles[phase])
    ax2.axvline(GOAL_AGE_P99_MS, color="grey", linestyle=":", label=f"goal p99 <= {GOAL_AGE_P99_MS} ms")
    _log_axis(ax2, [0.2, 0.5, 1, 2, 5, 10, 20, 50])
    ax2.set_xlabel("frame age at the recorder reader (ms, log scale): decoded - captured")
    ax2.set_ylabel("fraction of frames")
    ax2.set_title(f"{cfg['cameras']} cameras {cfg['width']}x{cfg['height']} RGB @ {cfg['fps']:g} fps, "
                  f"{cfg['camera_seconds']:g} s per run: frame age", fontsize=10)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.suptitle(f"robot_io bridge vs raw pyzmq, tcp loopback, {res['machine']['cpu_count']} CPU(s), "
                 f"{res['mode']} mode, {res['timestamp']}", fontsize=10)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("bridge", out=False, doc=__doc__.split("\n\n")[0])
    flags.add_quick(ap, "a few seconds (for tests); noisier figures")
    flags.add_out(ap)
    ap.add_argument("--no-sim", action="store_true", help="skip the SimFranka row")
    ap.add_argument("--io-threads", type=int, default=1,
                    help="libzmq I/O threads per process, for bridge and raw alike (default 1, libzmq's default)")
    ap.add_argument("--camera-phase", choices=("aligned", "spread", "both"), default=None,
                    help="aligned: the cameras capture at the same instants (synchronised cameras, the worst "
                    "case); spread: phases spread evenly over the frame period (free-running cameras); "
                    "default: both in full mode, aligned in quick mode")
    args = ap.parse_args(argv)

    if args.quick:
        cfg = {"rtt_n": 500, "rtt_warmup": 100, "rtt_block": 250, "sim_n": 200, "camera_seconds": 2.0}
    else:
        cfg = {"rtt_n": 5000, "rtt_warmup": 500, "rtt_block": 500, "sim_n": 2000, "camera_seconds": 10.0}
    cfg.update({"transport": "tcp://127.0.0.1", "cameras": 3, "width": 640, "height": 480, "fps": 30.0,
                "stream_hwm": 100, "frame_bytes": 640 * 480 * 3, "with_sim": not args.no_sim,
                "io_threads": args.io_threads})
    phase = args.camera_phase or ("aligned" if args.quick else "both")
    cfg["camera_phases"] = ["aligned", "spread"] if phase == "both" else [phase]
    zmq.Context.instance(io_threads=args.io_threads)  # this process's context (bridge and raw alike)

    # every loop below is bounded; this bounds the whole run too
    limit_s = 120 if args.quick else 400

    def _overtime(*_):
        raise TimeoutError(f"benchmark ran past {limit_s} s")

    signal.signal(signal.SIGALRM, _overtime)
    signal.alarm(limit_s)
    t_start = time.monotonic()
    print(f"bridge benchmark ({'quick' if args.quick else 'full'} mode)", flush=True)
    print("  command round trip ...", end=" ", flush=True)
    rtt = bench_rtt(cfg["rtt_n"], cfg["rtt_warmup"], cfg["rtt_block"], cfg["sim_n"], cfg["with_sim"])
    print(f"{time.monotonic() - t_start:.1f} s", flush=True)
    gc.collect()
    cams: dict = {}
    for phase in cfg["camera_phases"]:
        cams[phase] = {}
        for kind in ("bridge", "raw"):
            print(f"  cameras ({kind}, phases {phase}) ...", end=" ", flush=True)
            cams[phase][kind] = bench_cameras(kind, cfg["cameras"], cfg["width"], cfg["height"], cfg["fps"],
                                              cfg["camera_seconds"], cfg["stream_hwm"], phase, cfg["io_threads"])
            print(f"{time.monotonic() - t_start:.1f} s", flush=True)
    signal.alarm(0)
    res = {
        "benchmark": "robot_io bridge vs raw pyzmq",
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "machine": machine_info(),
        "config": cfg,
        "rtt": rtt,
        "cameras": cams,
        "duration_s": time.monotonic() - t_start,
    }
    res["goals"] = goals(rtt, cams)
    res["all_goals_met"] = all(g["met"] for g in res["goals"].values())
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(args.out / "bridge.json", res, "bridge", argv, args.quick, indent=1)
    plot(res, args.out / "bridge.png")
    print_table(res)
    print(f"\nwrote {args.out / 'bridge.json'} and {args.out / 'bridge.png'} "
          f"(measured in {res['duration_s']:.1f} s, {time.monotonic() - t_start:.1f} s with the plot)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
