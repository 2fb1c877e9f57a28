"""Discovery: where the backends are comes from a file, DNS or the Kubernetes API, and drives the
pool's live add and drain (the same calls as `/admin/backends`, gateway.admin).

    tidegate serve --endpoints-file /etc/tidegate/backends     # one address per line
    tidegate serve --discover-dns backends.llm.svc.cluster.local:5555
    tidegate serve --discover-k8s llm/tidegate-backend:zmq       # namespace/service[:port name]

Every `--discovery-interval` seconds each source is read; the pool then holds the union of what
they list, plus the `--backend` addresses given on the command line (never touched here):

    listed, not in the pool        -> added (placed on from its BackendInfo on)
    in the pool (added here), gone -> drained: no new requests, it leaves when its last finishes
    listed again while draining    -> added again once it has left

A source that cannot be read (a half-written file, a DNS timeout, the API server away) keeps
its last good list: a failed read never drains anything. Writers of the endpoints file replace
it by an atomic rename (write `backends.tmp`, `mv` it over `backends`); it is re-read when its
inode, size or mtime change, so nothing needs a file-system notification API. Formats: one
address per line (`#` starts a comment), or JSON: a list of addresses or {"backends": [...]}.
Addresses are the pool's: tcp://, ipc://, http://, https://.
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("tidegate.discovery")
SCHEMES = ("tcp://", "ipc://", "http://", "https://")


class DiscoveryError(ValueError):
    pass


def parse_endpoints(text: str) -> set[str]:
    """The addresses an endpoints file lists; DiscoveryError if any entry is not an address."""
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise DiscoveryError(f"not JSON: {exc}") from None
        if isinstance(data, dict):
            data = data.get("backends")
        if not isinstance(data, list) or not all(isinstance(a, str) for a in data):
            raise DiscoveryError('JSON must be a list of addresses or {"backends": [...]}')
        entries = [a.strip() for a in data]
    else:
        entries = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    addresses = {a for a in entries if a}
    bad = sorted(a for a in addresses if not a.startswith(SCHEMES) or len(a) <= 6)
    if bad:
        raise DiscoveryError(f"not a backend address: {bad[0]!r} (tcp://, ipc://, http://, "
                             "https://)")
    return addresses


def tcp_address(host: str, port: int, scheme: str = "tcp") -> str:
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


class EndpointsFile:
    """A file of addresses, re-read when it is replaced or changed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = f"file {path}"
        self._seen: tuple[int, int, int] | None = None
        self._last: set[str] | None = None
        self._error: str | None = None

    async def read(self) -> set[str] | None:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if key == self._seen:
                return self._last
            with open(self.path, encoding="utf-8") as f:  # noqa: ASYNC230 - a small local file
                text = f.read()
            addresses = parse_endpoints(text)
        except (OSError, UnicodeDecodeError, DiscoveryError) as exc:
            if self._error != str(exc):  # logged once per distinct failure
                log.warning("endpoints file %s: %s; keeping the last list", self.path, exc)
            self._seen, self._error = None, str(exc)
            return None
        self._seen, self._last, self._error = key, addresses, None
        return addresses


class DnsName:
    """The A/AAAA records of a name (a Kubernetes headless service: one per ready pod), each as
    scheme://ip:port. `resolve(host, port)`: an async getaddrinfo, for tests."""

    def __init__(self, host: str, port: int, scheme: str = "tcp", resolve=None) -> None:
        self.host, self.port, self.scheme = host, port, scheme
        self.name = f"dns {host}:{port}"
        self._resolve = resolve

    async def read(self) -> set[str] | None:
        resolve = self._resolve or asyncio.get_running_loop().getaddrinfo
        try:
            infos = await asyncio.wait_for(
                resolve(self.host, self.port, type=socket.SOCK_STREAM), timeout=5.0)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return set()  # the name has no records: a headless service with no ready pod
            log.warning("dns %s: %s; keeping the last list", self.host, exc)
            return None
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("dns %s: %s; keeping the last list", self.host, exc)
            return None
        return {tcp_address(sockaddr[0], self.port, self.scheme)
                for *_, sockaddr in infos}


class KubernetesEndpointSlices:
    """The ready endpoints of a Service, from its EndpointSlices (discovery.k8s.io/v1) through the
    official `kubernetes` client (`pip install 'tidegate[k8s]'`). `api`: a DiscoveryV1Api; by
    default one from the in-cluster service account, else from ~/.kube/config."""

    def __init__(self, namespace: str, service: str, port_name: str | None = None,
                 scheme: str = "tcp", api=None) -> None:
        self.namespace, self.service, self.port_name, self.scheme = (namespace, service,
                                                                     port_name, scheme)
        self.name = f"k8s {namespace}/{service}"
        self._api = api

    def _client(self):
        if self._api is None:
            from kubernetes import client, config
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.DiscoveryV1Api()
        return self._api

    def _list(self) -> set[str]:
        slices = self._client().list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}",
            _request_timeout=10)
        found = set()
        for s in slices.items or ():
            ports = [p for p in (s.ports or ()) if p.port is not None
                     and (self.port_name is None or p.name == self.port_name)]
            if not ports:
                continue
            for ep in s.endpoints or ():
                cond = ep.conditions
                # nil `ready` means ready (the API's rule); a terminating pod is not ready
                if cond is not None and cond.ready is False:
                    continue
                if ep.addresses:  # all addresses of one endpoint are the same pod: take the first
                    found.add(tcp_address(ep.addresses[0], ports[0].port, self.scheme))
        return found

    async def read(self) -> set[str] | None:
        try:
            return await asyncio.to_thread(self._list)
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3's and config errors
            log.warning("%s: %s; keeping the last list", self.name, exc)
            return None


@dataclass
class Membership:
    """Applies a wanted set of addresses to the pool; drains only what it added."""

    pool: object  # gateway.backend_pool.BackendPool
    owned: set[str] = field(default_factory=set)

    def apply(self, wanted: set[str]) -> tuple[list[str], list[str]]:
        current = {b.address: b for b in self.pool.backends}
        added, drained = [], []
        for address in sorted(wanted - current.keys()):
            try:
                self.pool.add_backend(address)
            except Exception as exc:  # noqa: BLE001 - e.g. ZMQError: only that address is skipped
                log.warning("discovery: cannot add %s: %s", address, exc)
                continue
            self.owned.add(address)
            added.append(address)
        for address in sorted(self.owned - wanted):
            b = current.get(address)
            if b is None:
                self.owned.discard(address)  # it has left
            elif not b.draining:
                self.pool.drain_backend(address)
                drained.append(address)
        if added or drained:
            log.info("discovery: added %s, draining %s", added or "-", drained or "-")
        return added, drained


class Discovery:
    """Reads every source each `interval_s` and applies the union to the pool."""

    def __init__(self, pool, sources: Iterable, interval_s: float = 1.0,
                 on_change: Callable[[list[str], list[str]], None] | None = None) -> None:
        self.sources = list(sources)
        self.interval_s = interval_s
        self.membership = Membership(pool)
        self._lists: dict[int, set[str]] = {}
        self._on_change = on_change

    async def step(self) -> tuple[list[str], list[str]]:
        for i, source in enumerate(self.sources):
            got = await source.read()
            if got is not None:
                self._lists[i] = got
        wanted = set().union(*self._lists.values()) if self._lists else set()
        added, drained = self.membership.apply(wanted)
        if (added or drained) and self._on_change is not None:
            self._on_change(added, drained)
        return added, drained

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # a bug here must not stop discovery for good
                log.exception("discovery step failed")
            await asyncio.sleep(self.interval_s)


def sources_from_args(args) -> list:
    """The sources named by serve's --endpoints-file / --discover-dns / --discover-k8s."""
    sources: list = []
    for path in getattr(args, "endpoints_file", None) or ():
        sources.append(EndpointsFile(path))
    for spec in getattr(args, "discover_dns", None) or ():
        host, sep, port = spec.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SystemExit(f"tidegate serve: error: --discover-dns {spec!r}: want HOST:PORT")
        sources.append(DnsName(host.strip("[]"), int(port)))
    for spec in getattr(args, "discover_k8s", None) or ():
        ns, sep, rest = spec.partition("/")
        service, _, port_name = rest.partition(":")
        if not sep or not ns or not service:
            raise SystemExit(f"tidegate serve: error: --discover-k8s {spec!r}: want "
                             "NAMESPACE/SERVICE[:PORT_NAME]")
        sources.append(KubernetesEndpointSlices(ns, service, port_name or None))
    return sources


def add_discovery_arguments(p) -> None:
    g = p.add_argument_group("discovery (gateway.discovery): backends added and drained live")
    g.add_argument("--endpoints-file", action="append", default=None, metavar="FILE",
                   help="watched file of backend addresses, one a line (replace it by rename)")
    g.add_argument("--discover-dns", action="append", default=None, metavar="HOST:PORT",
                   help="a name's A/AAAA records (a headless Service), each as tcp://IP:PORT")
    g.add_argument("--discover-k8s", action="append", default=None,
                   metavar="NAMESPACE/SERVICE[:PORT]",
                   help="a Service's ready EndpointSlice endpoints via the Kubernetes API "
                        "(needs the k8s extra)")
    g.add_argument("--discovery-interval", type=float, default=1.0,
                   help="seconds between reads of the discovery sources")


def discovery_ctx(sources: list, interval_s: float):
    """A cleanup_ctx entry running discovery with the app (after the gateway core)."""
    from gateway.app_keys import GATEWAY_KEY

    async def ctx(app):
        d = Discovery(app[GATEWAY_KEY].pool, sources, interval_s)
        await d.step()  # the first lists are applied before the server takes requests
        task = asyncio.create_task(d.run(), name="discovery")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return ctx
