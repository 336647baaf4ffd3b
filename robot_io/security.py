"""CurveZMQ for the bridge: a server bound off loopback must authenticate its peers.

Keys are the standard ZeroMQ certificate files written by ``zmq.auth.create_certificates``
(``vla bridge keys`` makes a set). The site file names them; nothing is hard-coded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import threading
from urllib.parse import urlparse

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


class SecurityError(RuntimeError):
    """The bridge refused to start or connect because authentication is not set up."""


@dataclasses.dataclass(frozen=True)
class CurveKeys:
    """Paths of CurveZMQ certificate files. A server needs ``server_secret`` and
    ``authorized_clients``; a client needs ``client_secret`` and ``server_public``."""

    server_secret: str | None = None
    """Server's ``.key_secret`` certificate (holds both halves of the server key pair)."""
    server_public: str | None = None
    """Server's ``.key`` public certificate, given to clients."""
    client_secret: str | None = None
    """This client's ``.key_secret`` certificate."""
    authorized_clients: str | None = None
    """Folder of ``.key`` public certificates of the clients the server accepts."""

    def resolve(self, base: str) -> "CurveKeys":
        def r(p):
            return None if p is None else os.path.normpath(os.path.join(base, os.path.expanduser(p)))

        return CurveKeys(r(self.server_secret), r(self.server_public), r(self.client_secret),
                         r(self.authorized_clients))


def is_local_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback address."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = urlparse(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', an interface name or a DNS name: treat as off loopback
        return False


_auth_lock = threading.Lock()
_authenticators: dict[int, ThreadAuthenticator] = {}


def _load(path: str, what: str) -> tuple[bytes, bytes | None]:
    if not path or not os.path.exists(path):
        raise SecurityError(f"CurveZMQ {what} file not found: {path!r} (make keys with `vla bridge keys --out DIR`)")
    public, secret = zmq.auth.load_certificate(path)
    return public, secret


def secure_server_socket(sock: zmq.Socket, endpoint: str, keys: CurveKeys | None, insecure: bool) -> None:
    """Configure ``sock`` before it binds to ``endpoint``. Off loopback without keys this refuses,
    unless ``insecure`` was passed explicitly."""
    if keys is None or keys.server_secret is None:
        if is_local_endpoint(endpoint) or insecure:
            return
        raise SecurityError(
            f"refusing to bind {endpoint} without CurveZMQ keys: anyone on the network could move the "
            "robot. Set security.server_secret and security.authorized_clients in the site file "
            "(`vla bridge keys --out DIR` makes them), or pass --insecure if you really mean it.")
    public, secret = _load(keys.server_secret, "server secret")
    if secret is None:
        raise SecurityError(f"{keys.server_secret} holds no secret key (use the .key_secret file)")
    if not keys.authorized_clients or not os.path.isdir(keys.authorized_clients):
        raise SecurityError(f"security.authorized_clients must be a folder of client public keys, "
                            f"got {keys.authorized_clients!r}")
    # One ZAP handler per context; each server socket gets its own ZAP domain for its folder of
    # authorised clients, so two servers in one process (one context) with different folders each
    # admit their own clients (one domain "*" for all admitted only the first server's clients).
    folder = os.path.abspath(keys.authorized_clients)
    domain = "vla-" + hashlib.sha256(folder.encode()).hexdigest()[:16]
    ctx = sock.context
    with _auth_lock:
        auth = _authenticators.get(id(ctx))
        if auth is None:
            auth = ThreadAuthenticator(ctx)
            auth.start()
            _authenticators[id(ctx)] = auth
        auth.configure_curve(domain=domain, location=folder)
    sock.zap_domain = domain.encode()
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def secure_client_socket(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    if keys is None or keys.client_secret is None:
        return
    public, secret = _load(keys.client_secret, "client secret")
    server_public, _ = _load(keys.server_public, "server public")
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


def keys_from_dir(keys_dir: str | None, client: str = "client") -> CurveKeys | None:
    """The key set ``make_keys`` (``vla bridge keys --out DIR``) writes: a server uses
    ``server.key_secret`` and ``authorized_clients/``, client ``NAME`` ``NAME.key_secret`` and
    ``server.key``. None for no folder."""
    if not keys_dir:
        return None
    if not os.path.isdir(keys_dir):
        raise SecurityError(f"CurveZMQ key folder not found: {keys_dir!r} (make one with `vla bridge keys --out DIR`)")
    j = lambda n: os.path.join(keys_dir, n)  # noqa: E731
    return CurveKeys(server_secret=j("server.key_secret"), server_public=j("server.key"),
                     client_secret=j(f"{client}.key_secret"), authorized_clients=j("authorized_clients"))


def make_keys(out_dir: str, clients: tuple[str, ...] = ("client",)) -> dict[str, str]:
    """Write a server key pair and one key pair per client; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    auth_dir = os.path.join(out_dir, "authorized_clients")
    os.makedirs(auth_dir, exist_ok=True)
    server_pub, server_sec = zmq.auth.create_certificates(out_dir, "server")
    paths = {"server_public": server_pub, "server_secret": server_sec, "authorized_clients": auth_dir}
    for c in clients:
        pub, sec = zmq.auth.create_certificates(out_dir, c)
        os.replace(pub, os.path.join(auth_dir, os.path.basename(pub)))
        paths[f"{c}_secret"] = sec
    return paths
