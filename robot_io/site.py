"""Site files: which devices a robot cell has, where they listen, their keys, limits, calibration.

A site is a YAML file (or a named preset shipped in ``robot_io/sites/``)::

    name: sim-franka
    security:                      # optional; required when any endpoint is off loopback
      server_secret: keys/server.key_secret
      authorized_clients: keys/authorized_clients
      server_public: keys/server.key
      client_secret: keys/client.key_secret
    robot: {arm: arm, cameras: [front, wrist]}   # how RobotClient composes an observation
    devices:
      arm:
        driver: sim_franka         # a name in hardware.REGISTRY
        command: tcp://127.0.0.1:5550
        stream: tcp://127.0.0.1:5551
        command_timeout_ms: 200
        limits: {workspace_min: [0.25, -0.45, 0.0], max_step_m: 0.05}
        params: {realtime: true}   # passed to the driver's constructor; "@arm" names another device
      front:
        driver: sim_camera
        command: tcp://127.0.0.1:5552
        stream: tcp://127.0.0.1:5553
        params: {sim: "@arm", camera: front, width: 224, height: 224, fps: 30}
        calibration: calib/front.yaml   # written by `vla calibrate`

Relative paths are relative to the site file. Errors name the file and the bad field.

Calibration files (``calibration/io.py``): validated when the site loads if they exist (a
missing one is what `vla calibrate` writes; the device is then served uncalibrated, with a
warning); :func:`build_servers` loads a camera's intrinsics into it and every device's
``describe()`` shows its file's sections under ``calibration``.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from importlib import resources
from typing import Any, Callable

import yaml

from robot_io.limits import check_limits
from robot_io.security import CurveKeys

PRESET_DIR = "sites"
log = logging.getLogger(__name__)


class SiteError(ValueError):
    """A site file is malformed; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    name: str
    driver: str
    command: str
    stream: str | None = None
    params: dict = dataclasses.field(default_factory=dict)
    limits: dict = dataclasses.field(default_factory=dict)
    command_timeout_ms: float = 200.0
    state_hz: float = 100.0
    stream_hwm: int = 100
    streaming: bool = True
    calibration: str | None = None
    roi: tuple[float, float, float, float] | None = None
    """Cameras: the region of the frame the policy should look at, ``[x0, y0, x1, y1]`` as fractions
    of the frame (a camera that frames the whole cell sees the objects a few pixels wide once the
    frame is shrunk for the model). ``vla record`` stores it with every episode and ``vla train``
    crops the camera to it unless ``--crop`` says otherwise. Not used by the bridge."""


@dataclasses.dataclass(frozen=True)
class SiteConfig:
    name: str
    path: str
    devices: dict[str, DeviceSpec]
    security: CurveKeys | None = None
    arm: str | None = None
    cameras: tuple[str, ...] = ()
    description: str = ""


_DEVICE_KEYS = {f.name for f in dataclasses.fields(DeviceSpec)} - {"name"}


def preset_names() -> list[str]:
    files = resources.files("robot_io").joinpath(PRESET_DIR)
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".yaml"))


def resolve_site_path(site: str) -> str:
    """A path to a YAML file, or the name of a preset (with a did-you-mean on typos)."""
    if os.path.exists(site):
        return os.path.abspath(site)
    if site.endswith((".yaml", ".yml")) or os.sep in site:
        raise SiteError(f"site file not found: {site}")
    names = preset_names()
    if site not in names:
        close = difflib.get_close_matches(site, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise SiteError(f"unknown site {site!r}: not a file and not a preset.{hint} Presets: {', '.join(names)}")
    return str(resources.files("robot_io").joinpath(PRESET_DIR, site + ".yaml"))


def load_site(site: str) -> SiteConfig:
    path = resolve_site_path(site)
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise SiteError(f"{path}: not valid YAML: {e}") from None
    return parse_site(raw, path)


def parse_site(raw: Any, path: str = "<site>") -> SiteConfig:
    base = os.path.dirname(os.path.abspath(path)) if path != "<site>" else os.getcwd()

    def err(field, msg):
        return SiteError(f"{path}: {field}: {msg}")

    if not isinstance(raw, dict):
        raise err("(top level)", "a site file must be a mapping with 'name' and 'devices'")
    unknown = set(raw) - {"name", "description", "security", "robot", "devices"}
    if unknown:
        raise err(sorted(unknown)[0], f"unknown top-level field; known: description, devices, name, robot, security")
    name = raw.get("name") or os.path.splitext(os.path.basename(path))[0]
    devs = raw.get("devices")
    if not isinstance(devs, dict) or not devs:
        raise err("devices", "must map device names to their settings (at least one device)")
    devices = {}
    for dname, d in devs.items():
        where = f"devices.{dname}"
        if not isinstance(d, dict):
            raise err(where, "must be a mapping")
        bad = set(d) - _DEVICE_KEYS
        if bad:
            k = sorted(bad)[0]
            close = difflib.get_close_matches(k, _DEVICE_KEYS, n=1)
            raise err(f"{where}.{k}", "unknown field" + (f"; did you mean {close[0]!r}?" if close else ""))
        for req in ("driver", "command"):
            if not isinstance(d.get(req), str):
                raise err(f"{where}.{req}", "required (a string)")
        for k in ("params", "limits"):
            if k in d and not isinstance(d[k], dict):
                raise err(f"{where}.{k}", "must be a mapping")
        for k in ("command", "stream"):
            ep = d.get(k)
            if ep is not None and not (isinstance(ep, str) and ep.split("://")[0] in ("tcp", "ipc", "inproc")):
                raise err(f"{where}.{k}", f"endpoint {ep!r} must look like tcp://HOST:PORT, ipc://PATH or inproc://NAME")
        for k in ("command_timeout_ms", "state_hz"):
            if k in d and not (isinstance(d[k], (int, float)) and d[k] > 0):
                raise err(f"{where}.{k}", f"must be a positive number, got {d[k]!r}")
        try:
            check_limits(d.get("limits"))
        except (TypeError, ValueError) as e:
            raise err(f"{where}.limits", str(e)) from None
        cal = d.get("calibration")
        if cal is not None:
            if not isinstance(cal, str) or not cal:
                raise err(f"{where}.calibration", f"must be the path of a calibration file, got {cal!r}")
            cal = os.path.normpath(os.path.join(base, cal))
            if os.path.exists(cal):  # validated now; a missing one is written by `vla calibrate`
                from calibration.io import CalibrationFileError, load_calibration  # numpy + yaml only

                try:
                    load_calibration(cal)
                except CalibrationFileError as e:
                    raise err(f"{where}.calibration", str(e)) from None
        roi = d.get("roi")
        if roi is not None:
            ok = isinstance(roi, (list, tuple)) and len(roi) == 4 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in roi)
            if not ok or not (0 <= roi[0] < roi[2] <= 1 and 0 <= roi[1] < roi[3] <= 1):
                raise err(f"{where}.roi", f"must be [x0, y0, x1, y1], fractions of the frame with "
                                          f"0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1, got {roi!r}")
            roi = tuple(float(v) for v in roi)
        devices[dname] = DeviceSpec(name=dname, **{**d, "calibration": cal, "roi": roi})
    for dname, d in devices.items():
        for k, v in d.params.items():
            if isinstance(v, str) and v.startswith("@") and v[1:] not in devices:
                raise err(f"devices.{dname}.params.{k}", f"refers to unknown device {v[1:]!r}")
    sec = raw.get("security")
    keys = None
    if sec is not None:
        if not isinstance(sec, dict):
            raise err("security", "must be a mapping of key file paths")
        bad = set(sec) - {f.name for f in dataclasses.fields(CurveKeys)}
        if bad:
            raise err(f"security.{sorted(bad)[0]}", "unknown field; known: authorized_clients, client_secret, "
                      "server_public, server_secret")
        keys = CurveKeys(**sec).resolve(base)
    robot = raw.get("robot") or {}
    arm = robot.get("arm")
    cams = tuple(robot.get("cameras") or ())
    for c in ([arm] if arm else []) + list(cams):
        if c not in devices:
            raise err("robot", f"names unknown device {c!r}; devices: {', '.join(devices)}")
    return SiteConfig(name=name, path=path, devices=devices, security=keys, arm=arm, cameras=cams,
                      description=raw.get("description", ""))


_LOOPBACK = ("127.0.0.1", "localhost")


def _loopback_port(value: Any) -> int | None:
    """The port of a ``tcp://127.0.0.1:PORT`` (or localhost) endpoint string, else None."""
    if not isinstance(value, str) or not value.startswith("tcp://"):
        return None
    host, _, port = value[len("tcp://"):].rpartition(":")
    return int(port) if host in _LOOPBACK and port.isdigit() else None


def site_ports(site: SiteConfig) -> list[int]:
    """The distinct loopback TCP ports ``site`` names: its devices' endpoints and endpoint-valued
    params (a camera filming a screen's stream, a HID link). SiteError if a device listens off
    loopback (a real robot cell: one site per robot, never copied onto other ports)."""
    ports: list[int] = []
    for name, d in site.devices.items():
        for where, value in [("command", d.command), ("stream", d.stream),
                             *((f"params.{k}", v) for k, v in d.params.items())]:
            port = _loopback_port(value)
            if port is None and where in ("command", "stream") and value is not None:
                raise SiteError(f"{site.path}: devices.{name}.{where}: {value!r} is not a loopback tcp endpoint; "
                                "only a site served on this machine's loopback can be copied onto other ports")
            if port is not None and port not in ports:
                ports.append(port)
    return ports


def relocate_site(site: SiteConfig, ports: list[int], path: str, name: str | None = None) -> SiteConfig:
    """A copy of ``site`` written to ``path`` with its loopback ports (``site_ports``, in that order)
    replaced by ``ports``, wherever they appear (endpoints and params alike, so devices that talk to
    each other still meet); relative file paths (calibration, keys) made absolute, so the copy works
    from any folder. ``name``: the copy's name (default ``<name>-<first port>``). -> the loaded copy."""
    old = site_ports(site)
    if len(ports) < len(old):
        raise ValueError(f"site {site.name!r} uses {len(old)} ports, {len(ports)} given")
    remap = dict(zip(old, ports))
    with open(site.path) as f:
        raw = yaml.safe_load(f)
    base = os.path.dirname(os.path.abspath(site.path))

    def moved(v: Any) -> Any:
        port = _loopback_port(v)
        return v if port is None else f"{v.rpartition(':')[0]}:{remap[port]}"

    for d in raw["devices"].values():
        for k in ("command", "stream"):
            if k in d:
                d[k] = moved(d[k])
        if isinstance(d.get("params"), dict):
            d["params"] = {k: moved(v) for k, v in d["params"].items()}
        if isinstance(d.get("calibration"), str):
            d["calibration"] = os.path.normpath(os.path.join(base, d["calibration"]))
    if isinstance(raw.get("security"), dict):
        raw["security"] = {k: os.path.normpath(os.path.join(base, v)) if isinstance(v, str) else v
                           for k, v in raw["security"].items()}
    raw["name"] = name or f"{site.name}-{ports[0]}"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    os.replace(tmp, path)
    return load_site(path)


def load_device_calibration(site: SiteConfig, name: str, device: Any = None):
    """The calibration file a site names for device ``name`` (``calibration.io.CalibrationFile``),
    or None when it names none or the file does not exist yet (logged). With ``device``, a camera's
    intrinsics are loaded into it (``Camera.set_intrinsics``)."""
    spec = site.devices[name]
    if spec.calibration is None:
        return None
    if not os.path.exists(spec.calibration):
        log.warning("%s: devices.%s.calibration: %s does not exist yet; serving %r uncalibrated (write it with "
                    "`vla calibrate`)", site.path, name, spec.calibration, name)
        return None
    from calibration.io import CalibrationFileError, load_calibration  # numpy + yaml only

    try:
        cal = load_calibration(spec.calibration)
    except CalibrationFileError as e:
        raise SiteError(f"{site.path}: devices.{name}.calibration: {e}") from None
    if device is not None and cal.intrinsics is not None and hasattr(device, "set_intrinsics"):
        i = cal.intrinsics
        try:
            device.set_intrinsics(i.K, i.dist, i.image_size)
        except ValueError as e:
            raise SiteError(f"{site.path}: devices.{name}.calibration: {e}") from None
    return cal


def build_servers(site: SiteConfig, load_driver: Callable[[str], type], insecure: bool = False,
                  only: list[str] | None = None):
    """Construct (not start) one DeviceServer per device. ``load_driver`` maps a driver name to a
    class (``hardware.load_driver``); passing it in keeps robot_io free of hardware imports."""
    from robot_io.server import SERVICES, DeviceServer

    built: dict[str, Any] = {}
    servers = []
    for name, spec in site.devices.items():
        if only and name not in only:
            continue
        cls = load_driver(spec.driver)
        kind = getattr(cls, "kind", "device")
        service_cls = SERVICES.get(kind)
        if service_cls is None:  # refused before the driver is constructed (it may open hardware)
            raise SiteError(f"{site.path}: devices.{name}.driver: {spec.driver!r} is a {kind!r} device, which the "
                            f"bridge cannot serve; known kinds: {', '.join(sorted(SERVICES))}")
        params = {k: (built[v[1:]] if isinstance(v, str) and v.startswith("@") else v) for k, v in spec.params.items()}
        try:
            device = cls(name=name, **params)
        except TypeError as e:
            raise SiteError(f"{site.path}: devices.{name}.params: {e}") from None
        built[name] = device
        cal = load_device_calibration(site, name, device)
        try:
            service = service_cls.from_spec(name, device, spec)
        except ValueError as e:  # e.g. limits of another kind of device
            raise SiteError(f"{site.path}: devices.{name}.limits: {e}") from None
        if cal is not None:
            service.calibration = cal.summary()
        servers.append(DeviceServer(service, spec.command, spec.stream if spec.streaming else None,
                                    command_timeout_ms=spec.command_timeout_ms, keys=site.security,
                                    insecure=insecure, stream_hwm=spec.stream_hwm))
    return servers
