"""tidegate on Ray: the gateway as a Ray Serve application, each backend a Serve replica holding
its node's GPUs (`pip install 'tidegate[ray]'`).

    serve run gateway.ray_app:app_builder model=/models/coder num_backends=2 gpus_per_backend=1
    # or, from Python on a Ray cluster:
    from ray import serve
    from gateway.ray_app import build_app
    serve.run(build_app(model="/models/coder", num_backends=2, gpus_per_backend=1))

    Serve's HTTP proxy ─▶ TidegateGateway (ingress, CPU) ─ZMQ+CURVE─▶ TidegateBackend x N (GPUs)
                              │ tidegate's gateway on a loopback port  ▲ `tidegate backend` child
                              └─ discovery (gateway.discovery) ◀─ EndpointRegistry (named actor)

TidegateGateway runs the same aiohttp gateway as `tidegate serve` inside its replica, and forwards
each request Serve hands it to that gateway (streams stay streams; a client that goes away closes
the stream and the gateway aborts its request). Its backends come from discovery over the
registry, so scaling the backend deployment (num_replicas, an autoscaling_config) adds and drains
backends live, as files or DNS do elsewhere.

TidegateBackend reserves `gpus_per_backend` GPUs of one node (Ray sets CUDA_VISIBLE_DEVICES; the
tensor-parallel ranks are processes of the backend, so one reservation of N GPUs is the placement
a TP group needs), runs `tidegate backend` as its child bound on the node's IP with CURVE keys made
by the app builder, and registers its address. Serve's health check checks the child and renews
the registration (an address not renewed for `registry_ttl_s` is dropped, so a replica lost with
its node is drained too). A replica that is stopped unregisters first and keeps serving for
`drain_s` while the gateways drain it, then stops its child (SIGTERM: in-flight requests answered).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
from ray import serve

log = logging.getLogger("tidegate.ray")
REGISTRY_NAMESPACE = "tidegate"


@ray.remote(num_cpus=0)
class EndpointRegistry:
    """Backend addresses with the time each was last renewed."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def register(self, address: str) -> None:
        self._seen[address] = time.monotonic()

    def unregister(self, address: str) -> None:
        self._seen.pop(address, None)

    def list(self, ttl_s: float) -> list[str]:
        now = time.monotonic()
        return sorted(a for a, t in self._seen.items() if now - t <= ttl_s)


def registry(name: str):
    return EndpointRegistry.options(name=name, namespace=REGISTRY_NAMESPACE, lifetime="detached",
                                    get_if_exists=True).remote()


class RegistrySource:
    """A discovery source (gateway.discovery) reading the registry."""

    def __init__(self, name: str, ttl_s: float) -> None:
        self.name = f"ray registry {name}"
        self._registry, self._ttl_s = registry(name), ttl_s

    async def read(self) -> set[str] | None:
        try:
            return set(await self._registry.list.remote(self._ttl_s))
        except ray.exceptions.RayError as exc:
            log.warning("%s: %s; keeping the last list", self.name, exc)
            return None


def make_curve_keys() -> dict[str, str]:
    """A key pair for the gateways and one for the backends, as file contents for the replicas."""
    from proto.security import generate

    with tempfile.TemporaryDirectory() as d:
        out = {}
        for who in ("gateway", "backend"):
            public, secret = generate(d, who)
            out[f"{who}.key"], out[f"{who}.key_secret"] = public.read_text(), secret.read_text()
        return out


def write_keys(keys: dict[str, str], names: list[str]) -> Path:
    d = Path(tempfile.mkdtemp(prefix="tidegate-keys-"))
    for name in names:
        (d / name).write_text(keys[name])
        os.chmod(d / name, 0o600)
    return d


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4096,
                  health_check_period_s=5)
class TidegateBackend:
    async def __init__(self, registry_name: str, keys: dict[str, str], backend_argv: list[str],
                       drain_s: float = 30.0, bind_host: str | None = None,
                       startup_timeout_s: float = 900.0) -> None:
        host = bind_host or ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.address = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        self._keys = write_keys(keys, ["backend.key_secret"])
        allow = self._keys / "allow"
        allow.mkdir()
        (allow / "gateway.key").write_text(keys["gateway.key"])
        cmd = [sys.executable, "-m", "gateway.tidegate_cli", "backend", "--listen", self.address,
               "--curve-key", str(self._keys / "backend.key_secret"), "--curve-allow", str(allow),
               *backend_argv]
        log.info("starting %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
        ready = await asyncio.to_thread(self._wait_ready, startup_timeout_s)
        if not ready:
            self.proc.kill()
            raise RuntimeError(f"tidegate backend did not start (exit {self.proc.poll()})")
        self._drain_s = drain_s
        self._registry = registry(registry_name)
        await self._registry.register.remote(self.address)

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stdout:  # the child's stdout, until its ready line
            sys.stdout.write(line)
            if line.startswith("tidegate backend ready"):
                threading.Thread(target=self._copy_output, daemon=True).start()
                return True
            if time.monotonic() > deadline:
                return False
        return False

    def _copy_output(self) -> None:
        for line in self.proc.stdout:
            sys.stdout.write(line)

    async def check_health(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"tidegate backend exited ({self.proc.returncode})")
        await self._registry.register.remote(self.address)

    async def address_of(self) -> str:
        return self.address

    async def __del__(self) -> None:
        """Stopped by Serve (scale-down, redeploy, shutdown): leave the registry, let the gateways
        drain this backend while it finishes its requests, then stop the child."""
        with _suppress_ray_errors():
            await self._registry.unregister.remote(self.address)
            await asyncio.sleep(self._drain_s)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class _suppress_ray_errors:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        return kind is not None and issubclass(kind, (ray.exceptions.RayError, AttributeError))


HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "host", "content-length"}


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4096)
class TidegateGateway:
    async def __init__(self, registry_name: str, keys: dict[str, str], serve_argv: list[str],
                       backends=None, registry_ttl_s: float = 30.0,
                       discovery_interval_s: float = 0.5) -> None:
        import aiohttp
        from aiohttp import web

        from gateway.app import create_app
        from gateway.discovery import discovery_ctx
        from gateway.serve import build_parser, gateway_config

        self._backends = backends  # the backend deployment: deployed with this application
        d = write_keys(keys, ["gateway.key_secret", "backend.key"])
        args = build_parser().parse_args([*serve_argv, "--curve-key", str(d / "gateway.key_secret"),
                                          "--backend-key", str(d / "backend.key")])
        source = RegistrySource(registry_name, registry_ttl_s)
        app = create_app(gateway_config(args, []),
                         extra_cleanup_ctx=[discovery_ctx([source], discovery_interval_s)])
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                              auto_decompress=False)

    async def __call__(self, request):
        """Serve's request (Starlette) to the gateway and back; the body streams as it comes."""
        from starlette.responses import StreamingResponse

        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url = self._base + request.url.path + (f"?{request.url.query}" if request.url.query
                                               else "")
        resp = await self._session.request(request.method, url, data=await request.body(),
                                           headers=headers)

        async def body():
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()  # a client gone: the stream closes, the gateway aborts the request

        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(body(), status_code=resp.status, headers=out_headers)

    async def __del__(self) -> None:
        with _suppress_ray_errors():
            await self._session.close()
            await self._runner.cleanup()


def build_app(model: str = "tiny", num_backends: int = 1, gpus_per_backend: int = 0,
              backend_args: list[str] = (), serve_args: list[str] = (), name: str = "tidegate",
              drain_s: float = 30.0, autoscaling_config: dict | None = None,
              keys: dict[str, str] | None = None, bind_host: str | None = None):
    """The Serve application: a gateway ingress and `num_backends` backends (or an autoscaling
    range), each with `gpus_per_backend` GPUs (0: the CPU; >1: tensor parallel over them).
    `keys`: the CURVE keys (make_curve_keys()); pass the same ones to re-run the application with
    another `num_backends` and Serve only adds or stops backends. `bind_host`: the backends'
    address (default: their node's IP)."""
    argv = ["--model", model]
    if gpus_per_backend:
        argv += ["--device", "cuda"]
    if gpus_per_backend > 1:
        argv += ["--tensor-parallel-size", str(gpus_per_backend)]
    keys = keys or make_curve_keys()
    registry_name = f"tidegate-endpoints-{name}"
    scale = ({"autoscaling_config": autoscaling_config} if autoscaling_config
             else {"num_replicas": num_backends})
    backends = TidegateBackend.options(
        ray_actor_options={"num_cpus": 1, "num_gpus": gpus_per_backend},
        graceful_shutdown_timeout_s=drain_s + 60, **scale,
    ).bind(registry_name, keys, [*argv, *backend_args], drain_s, bind_host)
    return TidegateGateway.bind(registry_name, keys, list(serve_args), backends)


def app_builder(args: dict):
    """`serve run gateway.ray_app:app_builder model=... num_backends=2 gpus_per_backend=1
    backend_args='--kv-cache-dtype fp8'` (Serve passes the key=value pairs as strings)."""
    return build_app(model=args.get("model", "tiny"),
                     num_backends=int(args.get("num_backends", 1)),
                     gpus_per_backend=int(args.get("gpus_per_backend", 0)),
                     backend_args=str(args.get("backend_args", "")).split(),
                     serve_args=str(args.get("serve_args", "")).split(),
                     name=args.get("name", "tidegate"),
                     drain_s=float(args.get("drain_s", 30.0)))
