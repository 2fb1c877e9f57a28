"""CURVE on tidegate's TCP ZeroMQ sockets: key files, the server/client settings, the ZAP
allow-list, and the rule that refuses an open TCP bind.

    tidegate keys generate DIR --name backend    # DIR/backend.key (public), backend.key_secret
    tidegate backend --listen tcp://0.0.0.0:5555 --curve-key DIR/backend.key_secret \\
        --curve-allow DIR/clients/                # public keys allowed to connect
    tidegate serve --backend tcp://10.0.0.5:5555 --curve-key DIR/gateway.key_secret \\
        --backend-key DIR/backend.key

Key files are ZeroMQ's certificate format (`zmq.auth.create_certificates`); a secret file holds
the public key too. Keys travel as file paths only, never on a command line or in a log line.
A server with an allow-list runs a ZAP handler that admits exactly the listed public keys;
without one, any client that knows the server's public key may connect (still encrypted).
`ipc://` endpoints keep using file permissions and need no keys.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.asyncio
import zmq.auth


class SecurityError(ValueError):
    """A key file is missing or unreadable, or a bind would be open to the network."""


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """One side's CURVE settings. `secret_file`: our key pair. `server_public_file`: for a
    connecting socket, the public key of the server it talks to. `allow_dir`: for a binding
    socket, the directory of client public keys that may connect (None: any key)."""

    secret_file: Path
    server_public_file: Path | None = None
    allow_dir: Path | None = None

    def pair(self) -> tuple[bytes, bytes]:
        return load_pair(self.secret_file)

    def apply_server(self, sock: zmq.Socket) -> None:
        public, secret = self.pair()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def apply_client(self, sock: zmq.Socket) -> None:
        if self.server_public_file is None:
            raise SecurityError("a CURVE client needs the server's public key file")
        public, secret = self.pair()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = load_public(self.server_public_file)


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write `name.key` (public) and `name.key_secret` (secret, mode 0600) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def load_pair(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) from a secret key file."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read the key pair in {path}: {exc}") from None
    if secret is None:
        raise SecurityError(f"{path} holds no secret key (a .key_secret file is needed)")
    return public, secret


def load_public(path: str | Path) -> bytes:
    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read the public key in {path}: {exc}") from None
    return public


def is_loopback_or_local(address: str) -> bool:
    """True for ipc://, inproc:// and TCP addresses that only this machine can reach."""
    parts = urlsplit(address)
    if parts.scheme != "tcp":
        return True
    host = (parts.hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name or a host name: ask the resolver
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback
                       for a in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def check_bind(address: str, keys: CurveKeys | None, insecure: bool) -> None:
    """Refuse to bind a TCP address other machines can reach without CURVE keys."""
    if keys is None and not insecure and not is_loopback_or_local(address):
        raise SecurityError(
            f"refusing to listen on {address} without CURVE keys: anyone who can reach it could "
            "use the service. Give --curve-key (see `tidegate keys generate`), bind a loopback "
            "or ipc:// address, or pass --insecure to accept the risk.")


def start_authenticator(ctx: zmq.Context, allow_dir: Path | None):
    """A ZAP handler on `ctx` admitting the CURVE public keys in `allow_dir` (any key when None).
    Returns the authenticator; call `.stop()` on shutdown. An asyncio context gets the asyncio
    authenticator (it must be called inside the running loop), a plain one a thread."""
    if allow_dir is not None and not Path(allow_dir).is_dir():
        raise SecurityError(f"--curve-allow {allow_dir}: not a directory of public key files")
    if isinstance(ctx, zmq.asyncio.Context):
        from zmq.auth.asyncio import AsyncioAuthenticator

        auth = AsyncioAuthenticator(ctx)
    else:
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(allow_dir) if allow_dir is not None
                         else zmq.auth.CURVE_ALLOW_ANY)
    return auth


def keys_from_args(secret: str | None, server_public: str | None = None,
                   allow: str | None = None) -> CurveKeys | None:
    """CurveKeys from command-line paths (None without a secret key file); the files are read
    once here so that a wrong path fails at start-up, not on the first connection."""
    if secret is None:
        if server_public or allow:
            raise SecurityError("--backend-key / --curve-allow need --curve-key as well")
        return None
    keys = CurveKeys(Path(secret), Path(server_public) if server_public else None,
                     Path(allow) if allow else None)
    keys.pair()
    if keys.server_public_file is not None:
        load_public(keys.server_public_file)
    return keys

