"""Several "hosts" on one machine for tests: network namespaces joined by a bridge that lives in a
namespace of its own (nothing is added to the machine's own network), each running its processes.

    with Hosts(["gw", "b1", "b2"]) as hosts:      # 10.233.<net>.1, .2, .3
        p = hosts.popen("b1", [sys.executable, ...])
        hosts.kill("b1")                          # every process of that host, SIGKILL

Also the streaming load client the failover test runs inside the gateway's host:
    python tests/netns_hosts.py client URL N SIGNAL_AT MAX_TOKENS
prints `STARTED k` once k streams have their first token, then one JSON line with every
request's outcome; `python tests/netns_hosts.py health URL N TIMEOUT` waits until the gateway's
/health counts N healthy backends.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def can_make_namespaces() -> str | None:
    """None if network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"tgprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except subprocess.CalledProcessError as exc:
        return f"ip netns add failed: {exc.stderr.strip()}"
    return None


class Hosts:
    def __init__(self, names: list[str], net: int = 233) -> None:
        tag = f"{os.getpid() % 100000}"
        self.switch = f"tgsw{tag}"
        self.ns = {h: f"tg{h}{tag}" for h in names}
        self.ip = {h: f"10.{net}.{os.getpid() % 250}.{i + 1}" for i, h in enumerate(names)}
        self._procs: list[subprocess.Popen] = []

    def __enter__(self):
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
            _ip("link", "set", "br0", "up", ns=self.switch)
            for i, (h, ns) in enumerate(self.ns.items()):
                _ip("netns", "add", ns)
                _ip("link", "set", "lo", "up", ns=ns)
                # one veth pair per host: eth0 in the host, its peer on the switch's bridge
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name",
                    f"port{i}", "netns", self.switch)
                _ip("link", "set", f"port{i}", "master", "br0", "up", ns=self.switch)
                _ip("addr", "add", f"{self.ip[h]}/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def popen(self, host: str, cmd: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[host], *cmd], **kw)
        self._procs.append(p)
        return p

    def pids(self, host: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns[host]], capture_output=True,
                             text=True, check=False).stdout
        return [int(p) for p in out.split()]

    def kill(self, host: str) -> list[int]:
        """The host dies: SIGKILL to every process in its namespace (all started by us)."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return pids

    def __exit__(self, *exc) -> None:
        for host in self.ns:
            self.kill(host)
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for ns in [*self.ns.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


# --- the load client ------------------------------------------------------------------------------

async def _one(session, url: str, i: int, max_tokens: int, started: list, signal_at: int) -> dict:
    body = {"prompt": f"stream {i}: def f{i}(", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    out = {"i": i, "status": None, "events": 0, "completion_tokens": None, "finishes": [],
           "errors": [], "done": 0}
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            out["status"] = resp.status
            if resp.status != 200:
                out["errors"].append(await resp.text())
                return out
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    out["done"] += 1
                    continue
                event = json.loads(data)
                if "error" in event:
                    out["errors"].append(event["error"].get("code"))
                    continue
                if event.get("usage") and not event.get("choices"):  # the usage chunk
                    out["completion_tokens"] = event["usage"]["completion_tokens"]
                    continue
                choice = event["choices"][0]
                out["events"] += 1
                if out["events"] == 1:
                    started.append(i)
                    if len(started) == signal_at:
                        print(f"STARTED {signal_at}", flush=True)
                if choice.get("finish_reason"):
                    out["finishes"].append(choice["finish_reason"])
    except Exception as exc:  # noqa: BLE001 - any transport failure is this request's outcome
        out["errors"].append(f"transport: {exc!r}")
    return out


async def _client(url: str, n: int, signal_at: int, max_tokens: int) -> list[dict]:
    import aiohttp

    started: list[int] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        return await asyncio.gather(*(_one(session, url, i, max_tokens, started, signal_at)
                                      for i in range(n)))


def _wait_health(url: str, n: int, timeout_s: float) -> int:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if json.loads(r.read()).get("backends") == n:
                    return 0
        except OSError:
            pass
        time.sleep(0.2)
    return 1


if __name__ == "__main__" and sys.argv[1:2] == ["health"]:
    sys.exit(_wait_health(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
if __name__ == "__main__" and sys.argv[1:2] == ["client"]:
    url, n, signal_at, max_tokens = sys.argv[2], *map(int, sys.argv[3:6])
    results = asyncio.run(_client(url, n, signal_at, max_tokens))
    print(json.dumps(results), flush=True)
