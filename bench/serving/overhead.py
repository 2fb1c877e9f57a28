"""`tidegate bench overhead`: what the gateway itself costs, against an engine with no model.

    tidegate bench overhead                                   # ~45 s: every path at c=1 and c=64
    tidegate bench overhead --duration 2 --concurrency 1 64 --json overhead.json
    tidegate bench overhead --profile-gateway /tmp/gw.prof    # the gateway under cProfile

One run starts, as separate processes: `tidegate serve --backend embedded --model echo` (an echo
backend, see backend/engine/echo.py, behind the HTTP gateway and its `--zmq-listen` front door), a bare
aiohttp server (one trivial JSON endpoint, uvloop, like the gateway) and a raw pyzmq ROUTER that
sends every message straight back. Then, one path at a time, a closed loop of C clients sends
1-output-token requests for `--duration` seconds (or `--requests` requests) after `--warmup`:

  http_gateway   POST /v1/completions {"prompt": [ids], "max_tokens": 1} through the gateway
  bare_aiohttp   the same request, same client code, to the trivial endpoint
  zmq_client     gateway.client: `Client.generate` at C=1, `AsyncClient.generate` x C otherwise
  raw_zmq        a DEALER sending the same frames to the echo ROUTER (sync at C=1, asyncio x C)

Reported per path and concurrency: requests/s, latency mean/P50/P90/P99/max, the latency added
over the matching baseline (http_gateway - bare_aiohttp, zmq_client - raw_zmq, at the same C), and
the CPU each process spent per request (from /proc; the gateway's backend counted separately).
The goals of issue 16 are checked: zmq_client P99 at C=1 <= 0.5 ms, and the HTTP gateway's
request rate >= 50% of bare aiohttp's (at the highest concurrency; C=1 is reported too).
Everything shares this machine's cores with the client, so the load average is recorded.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PATHS = ("http_gateway", "bare_aiohttp", "zmq_client", "raw_zmq")
BASELINE = {"http_gateway": "bare_aiohttp", "zmq_client": "raw_zmq"}
GOAL_ZMQ_P99_MS = 0.5
GOAL_HTTP_RATIO = 0.5  # issue 16 (issue 4 section 7 asked for 0.4)
PROMPT = [104, 101, 108, 108, 111, 32, 119, 111]  # 8 byte-level ids ("hello wo")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- the measured loop -----------------------------------------------------------------------
@dataclass
class Phase:
    """Closed-loop measurement bookkeeping, shared by the sync and the asyncio drivers."""
    warmup_s: float
    duration_s: float
    max_requests: int | None
    t_warm: float = 0.0
    t_end: float = 0.0
    started: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    last_end: float = 0.0
    error_sample: str = ""
    total_done: int = 0  # warmup included

    def begin(self) -> None:
        now = time.perf_counter()
        self.t_warm = now + self.warmup_s
        self.t_end = self.t_warm + self.duration_s

    def may_start(self, now: float) -> bool:
        """Start another request? Counts it as measured when it starts after the warmup."""
        if now >= self.t_end:
            return False
        if now >= self.t_warm:
            if self.max_requests is not None and self.started >= self.max_requests:
                return False
            self.started += 1
        return True

    def done(self, t0: float, t1: float, ok: bool, detail: str = "") -> None:
        self.total_done += 1
        if t0 < self.t_warm:
            return
        if ok:
            self.latencies.append(t1 - t0)
        else:
            self.errors += 1
            self.error_sample = self.error_sample or detail
        self.last_end = max(self.last_end, t1)


async def _closed_loop(phase: Phase, concurrency: int, one) -> None:
    """`concurrency` workers, each sending `await one()` back to back until the phase ends."""
    async def worker() -> None:
        while True:
            t0 = time.perf_counter()
            if not phase.may_start(t0):
                return
            try:
                await one()
                ok, detail = True, ""
            except Exception as exc:  # noqa: BLE001 -- counted, never raised
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            phase.done(t0, time.perf_counter(), ok, detail)

    phase.begin()
    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _sync_loop(phase: Phase, one) -> None:
    phase.begin()
    while True:
        t0 = time.perf_counter()
        if not phase.may_start(t0):
            return
        try:
            one()
            ok, detail = True, ""
        except Exception as exc:  # noqa: BLE001
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        phase.done(t0, time.perf_counter(), ok, detail)


# ---- drivers -----------------------------------------------------------------------------------
async def drive_http(url: str, model: str, phase: Phase, concurrency: int) -> None:
    """The same client code for the gateway and the bare server: a non-streaming POST."""
    import aiohttp

    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 1,
                       "temperature": 0.0}).encode()
    headers = {"Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def one() -> None:
            async with session.post(url, data=body, headers=headers) as r:
                data = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")

        for _ in range(3):  # open the connections before the clock starts
            await one()
        await _closed_loop(phase, concurrency, one)


def drive_zmq_client(address: str, phase: Phase, concurrency: int) -> None:
    if concurrency == 1:
        from gateway.client import Client

        with Client(address) as c:
            def one() -> None:
                r = c.generate(PROMPT, max_tokens=1, temperature=0.0)
                if len(r.token_ids) != 1:
                    raise RuntimeError(f"expected 1 token, got {len(r.token_ids)}")
            one()
            _sync_loop(phase, one)
        return
    _run_async(_drive_async_client(address, phase, concurrency))


async def _drive_async_client(address: str, phase: Phase, concurrency: int) -> None:
    from gateway.client import AsyncClient

    async with AsyncClient(address) as c:
        async def one() -> None:
            r = await c.generate(PROMPT, max_tokens=1, temperature=0.0)
            if len(r.token_ids) != 1:
                raise RuntimeError(f"expected 1 token, got {len(r.token_ids)}")
        await one()
        await _closed_loop(phase, concurrency, one)


def _ping_frames() -> list[bytes]:
    """Frames the size of a real 1-token request (a Batch envelope + the prompt ids)."""
    import numpy as np
    return [b"\x0a" + bytes(40), np.asarray(PROMPT, dtype=np.int32).tobytes()]


def drive_raw_zmq(address: str, phase: Phase, concurrency: int) -> None:
    import zmq

    if concurrency == 1:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        frames = _ping_frames()

        def one() -> None:
            sock.send_multipart([b"0", *frames])
            if not sock.poll(5000):
                raise TimeoutError("no echo within 5 s")
            sock.recv_multipart(copy=False)
        try:
            one()
            _sync_loop(phase, one)
        finally:
            sock.close(linger=0)
            ctx.term()
        return
    _run_async(_drive_raw_async(address, phase, concurrency))


async def _drive_raw_async(address: str, phase: Phase, concurrency: int) -> None:
    """One asyncio DEALER, C tasks, replies matched by a tag frame (as AsyncClient does by id)."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    frames = _ping_frames()
    waiters: dict[bytes, asyncio.Future] = {}
    loop = asyncio.get_running_loop()
    counter = iter(range(1 << 62))

    async def reader() -> None:
        while True:
            tag, *_ = await sock.recv_multipart()
            fut = waiters.pop(tag, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def one() -> None:
        tag = str(next(counter)).encode()
        fut = waiters[tag] = loop.create_future()
        await sock.send_multipart([tag, *frames])
        await asyncio.wait_for(fut, 5.0)

    task = asyncio.create_task(reader())
    try:
        await one()
        await _closed_loop(phase, concurrency, one)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sock.close(linger=0)
        ctx.term()


def _run_async(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# ---- the servers (child processes) ------------------------------------------------------------
def serve_bare_http(port: int) -> int:
    """A trivial JSON endpoint: parse the body, answer a fixed completion-shaped object."""
    from aiohttp import web

    from gateway.stop_signals import StopSignals

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({
            "id": "cmpl-bare", "object": "text_completion", "created": 0,
            "model": body.get("model", "bare"),
            "choices": [{"index": 0, "text": "h", "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": len(body.get("prompt", ())), "completion_tokens": 1,
                      "total_tokens": len(body.get("prompt", ())) + 1}})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        stop = asyncio.Event()
        signals.attach(asyncio.get_running_loop(), stop)
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            print("bare aiohttp ready", flush=True)
            await stop.wait()
            await runner.cleanup()
        finally:
            signals.detach()

    # SIGTERM/SIGINT owned as `tidegate serve` owns them (gateway.stop_signals): the loop's
    # add_signal_handler would leave them at SIG_DFL once the loop closes
    signals = StopSignals().install()
    try:
        _run_async(main())
    finally:
        signals.ignore()
    return 0


def serve_zmq_echo(address: str) -> int:
    """A ROUTER that sends every message straight back (the raw ping-pong's far end)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    print("zmq echo ready", flush=True)
    while not stopping:
        try:
            if sock.poll(200):
                sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
        except zmq.ZMQError:
            continue
    sock.close(linger=0)
    ctx.term()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finalization would reset a Python handler
    return 0


def profile_gateway(out: str, argv: list[str]) -> int:
    """`tidegate <argv>` under cProfile on the main thread's CPU clock (time.thread_time): on a
    shared machine a wall-clock profile charges preemption to whatever call was running.
    The profiler runs only between SIGUSR1 (sent once the servers are ready) and the end, so
    start-up (imports, the app's set-up) does not drown the per-request path."""
    import cProfile

    from gateway.tidegate_cli import main as tidegate_main

    prof = cProfile.Profile(time.thread_time)
    signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
    try:
        return tidegate_main(argv)
    finally:
        prof.disable()
        prof.dump_stats(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Child:
    """A server process whose output goes to a file (a pipe nobody reads would block it)."""

    def __init__(self, name: str, cmd: list[str], ready: str, logdir: str) -> None:
        self.name = name
        self.ready = ready
        self.log_path = os.path.join(logdir, f"{name}.log")
        self._log = open(self.log_path, "w")  # noqa: SIM115 -- closed in stop()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.ready in Path(self.log_path).read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = Path(self.log_path).read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{self.name} did not start (exit {self.proc.poll()}):\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _children_of(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---- statistics --------------------------------------------------------------------------------
def _percentile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        return math.nan
    k = (len(sorted_xs) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (k - lo)


def summarize(phase: Phase) -> dict:
    xs = sorted(phase.latencies)
    n = len(xs)
    span = phase.last_end - phase.t_warm if n else 0.0
    ms = [x * 1000 for x in xs]
    return {
        "requests": n, "errors": phase.errors, "duration_s": span,
        "requests_per_s": n / span if span > 0 else math.nan,
        "latency_ms": {"mean": sum(ms) / n if n else math.nan, "p50": _percentile(ms, 50),
                       "p90": _percentile(ms, 90), "p99": _percentile(ms, 99),
                       "max": ms[-1] if n else math.nan},
        **({"error_sample": phase.error_sample} if phase.error_sample else {}),
    }


# ---- the run -------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate bench overhead",
                                description="Gateway overhead against an echo backend, next to a bare "
                                            "aiohttp handler and a raw pyzmq ping-pong.")
    p.add_argument("--duration", type=float, default=4.0,
                   help="measured seconds per path and concurrency (default 4)")
    p.add_argument("--requests", type=int, default=None,
                   help="stop a measurement after this many requests (default: no cap)")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each one")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64],
                   help="closed-loop clients (default: 1 64)")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                   help="extra `tidegate serve` argument, repeatable (e.g. --gateway-arg=--log-level="
                        "warning)")
    p.add_argument("--profile-gateway", default=None, metavar="PATH",
                   help="run the gateway under cProfile (main thread CPU time) and write its "
                        "stats here")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--json", default=None, help="write the result here")
    return p


class Servers:
    def __init__(self, args, logdir: str) -> None:
        py = sys.executable
        self.http_port, self.bare_port = free_port(), free_port()
        self.zmq_addr = f"tcp://127.0.0.1:{free_port()}"
        self.echo_addr = f"tcp://127.0.0.1:{free_port()}"
        paths = set(args.paths)
        self.children: list[Child] = []
        if paths & {"http_gateway", "zmq_client"}:
            prof = ["-m", "bench.serving.overhead", "_profile", os.path.abspath(args.profile_gateway)] \
                if args.profile_gateway else ["-m", "gateway.tidegate_cli"]
            self.gateway = Child("gateway", [
                py, *prof, "serve", "--backend", "embedded", "--model", "echo",
                "--port", str(self.http_port), "--zmq-listen", self.zmq_addr, *args.gateway_arg],
                "ZMQ front door on", logdir)
            self.children.append(self.gateway)
        if "bare_aiohttp" in paths:
            self.children.append(Child("bare_aiohttp", [
                py, "-m", "bench.serving.overhead", "_bare_http", str(self.bare_port)],
                "bare aiohttp ready", logdir))
        if "raw_zmq" in paths:
            self.children.append(Child("zmq_echo", [
                py, "-m", "bench.serving.overhead", "_zmq_echo", self.echo_addr], "zmq echo ready", logdir))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for c in self.children:
            c.wait_ready(deadline)

    def pids(self) -> dict[str, int]:
        out = {}
        for c in self.children:
            out[c.name] = c.proc.pid
            if c.name == "gateway":
                kids = _children_of(c.proc.pid)
                if kids:
                    out["backend"] = kids[0]
        return out

    def stop(self) -> None:
        for c in self.children:
            c.stop()


def measure(args, servers: Servers, path: str, concurrency: int) -> dict:
    phase = Phase(args.warmup, args.duration, args.requests)
    pids = servers.pids()
    names = {"http_gateway": ("gateway", "backend"), "zmq_client": ("gateway", "backend"),
             "bare_aiohttp": ("bare_aiohttp",), "raw_zmq": ("zmq_echo",)}[path]
    cpu0 = {n: _cpu_s(pids[n]) for n in names if n in pids}
    me0 = _self_cpu_s()
    if path == "http_gateway":
        _run_async(drive_http(f"http://127.0.0.1:{servers.http_port}/v1/completions", "echo",
                              phase, concurrency))
    elif path == "bare_aiohttp":
        _run_async(drive_http(f"http://127.0.0.1:{servers.bare_port}/v1/completions", "echo",
                              phase, concurrency))
    elif path == "zmq_client":
        drive_zmq_client(servers.zmq_addr, phase, concurrency)
    else:
        drive_raw_zmq(servers.echo_addr, phase, concurrency)
    res = summarize(phase)
    cpu = {n: (_cpu_s(pids[n]) - cpu0[n]) for n in cpu0}
    cpu["client"] = _self_cpu_s() - me0
    res["cpu_s"] = cpu
    # the whole phase's CPU (warmup included) over every request the phase completed
    res["cpu_us_per_request"] = {n: v / max(1, phase.total_done) * 1e6 for n, v in cpu.items()}
    return res


def add_comparisons(results: dict) -> None:
    for path, base in BASELINE.items():
        for c, r in results.get(path, {}).items():
            b = results.get(base, {}).get(c)
            if b is None:
                continue
            r["baseline"] = base
            r["added_latency_ms"] = {q: r["latency_ms"][q] - b["latency_ms"][q]
                                     for q in ("mean", "p50", "p99")}
            r["rate_vs_baseline"] = r["requests_per_s"] / b["requests_per_s"]


def check_goals(results: dict, concurrencies: list[int]) -> dict:
    goals = {}
    z1 = results.get("zmq_client", {}).get("1")
    if z1 is not None:
        v = z1["latency_ms"]["p99"]
        goals["zmq_client_p99_ms_at_c1"] = {"value": v, "target_max": GOAL_ZMQ_P99_MS,
                                            "met": bool(v <= GOAL_ZMQ_P99_MS)}
    http = results.get("http_gateway", {})
    for c in sorted(concurrencies):
        r = http.get(str(c))
        if r is not None and "rate_vs_baseline" in r:
            v = r["rate_vs_baseline"]
            goals[f"http_rate_vs_bare_at_c{c}"] = {"value": v, "target_min": GOAL_HTTP_RATIO,
                                                  "met": bool(v >= GOAL_HTTP_RATIO)}
    return goals


def format_table(out: dict) -> str:
    cols = ("path", "conc", "req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "rate/base",
            "server CPU us/req", "client us/req")
    rows = []
    for path in PATHS:
        for c, r in out["results"].get(path, {}).items():
            lat, add = r["latency_ms"], r.get("added_latency_ms", {})
            cpu = r["cpu_us_per_request"]
            server = " + ".join(f"{n} {v:.0f}" for n, v in cpu.items() if n != "client")
            rows.append((path, c, f"{r['requests_per_s']:.0f}", f"{lat['p50']:.3f}",
                         f"{lat['p99']:.3f}",
                         f"{add['p50']:+.3f}" if add else "", f"{add['p99']:+.3f}" if add else "",
                         f"{r['rate_vs_baseline']:.2f}" if "rate_vs_baseline" in r else "",
                         server, f"{cpu['client']:.0f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    def line(xs) -> str:
        return "  ".join(str(x).rjust(w) if i else str(x).ljust(w)
                         for i, (x, w) in enumerate(zip(xs, widths)))

    m = out["machine"]
    title = (f"tidegate bench overhead: 1 output token, {out['config']['duration']:g} s per row, "
             f"{m['cpu_count']} CPUs, load average {m['loadavg_start'][0]:.2f} at start, "
             f"{m['loadavg_end'][0]:.2f} at end")
    head = [title, line(cols), line("-" * w for w in widths)]
    tail = []
    for name, g in out["goals"].items():
        target = (f"<= {g['target_max']}" if "target_max" in g else f">= {g['target_min']}")
        tail.append(f"goal {name}: {g['value']:.3f} ({target}): {'met' if g['met'] else 'MISSED'}")
    errors = [f"{p}@{c}: {r['errors']} errors ({r.get('error_sample', '')})"
              for p, rs in out["results"].items() for c, r in rs.items() if r["errors"]]
    return "\n".join(head + [line(r) for r in rows] + tail + errors)


def run(args) -> dict:
    logdir = tempfile.mkdtemp(prefix="tidegate-overhead-")
    load0 = os.getloadavg()
    t0 = time.monotonic()
    servers = Servers(args, logdir)
    results: dict[str, dict[str, dict]] = {}
    try:
        servers.wait_ready(args.startup_timeout)
        startup_s = time.monotonic() - t0
        if args.profile_gateway:
            servers.gateway.proc.send_signal(signal.SIGUSR1)  # start profiling now
        for c in args.concurrency:
            for path in PATHS:
                if path in args.paths:
                    results.setdefault(path, {})[str(c)] = measure(args, servers, path, c)
    finally:
        servers.stop()
    add_comparisons(results)
    config = {k: v for k, v in vars(args).items()}
    out = {"format": "tidegate-overhead/1",
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "loadavg_start": list(load0),
                       "loadavg_end": list(os.getloadavg()), "python": sys.version.split()[0]},
           "config": config, "startup_s": startup_s, "total_s": time.monotonic() - t0,
           "output_tokens": 1, "prompt_tokens": len(PROMPT), "results": results,
           "goals": check_goals(results, args.concurrency), "logs": logdir}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_bare_http":
        return serve_bare_http(int(argv[1]))
    if argv and argv[0] == "_profile":
        return profile_gateway(argv[1], argv[2:])
    if argv and argv[0] == "_zmq_echo":
        return serve_zmq_echo(argv[1])
    args = parser().parse_args(argv)
    if args.duration <= 0 or (args.requests is not None and args.requests < 1) or \
            any(c < 1 for c in args.concurrency):
        parser().error("--duration, --requests and --concurrency must be positive")
    try:
        out = run(args)
    except RuntimeError as exc:
        print(f"tidegate bench overhead: {exc}", file=sys.stderr)
        return 1
    print(format_table(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    bad = [f"{p}@{c}" for p, rs in out["results"].items() for c, r in rs.items()
           if not r["requests"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
