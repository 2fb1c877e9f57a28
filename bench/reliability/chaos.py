"""Chaos under load (issue 13): `kill -9`, SIGSTOP/SIGCONT and a restart of backends while
streams run through a real `tidegate serve`; every request must end exactly once (its finish,
or a clear error), the survivors must hold no KV block afterwards, and the restarted backend
must rejoin.

    .venv/bin/python -m bench.reliability.chaos                    # 64 streams, ~20 s timeline
    .venv/bin/python -m bench.reliability.chaos --streams 64 --scale 3 --json out.json

Backends are `tidegate backend --model echo --echo-step-ms N` processes (the real worker loop,
KV blocks counted, a step that sleeps instead of burning a core), so the run is cheap enough
for a 2-core CI machine; tests/test_chaos.py runs it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]


def start_backend(address: str, step_ms: float, log: Path | None = None) -> subprocess.Popen:
    err = open(log, "a") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "backend", "--model", "echo",
         "--echo-step-ms", str(step_ms), "--listen", address, "--max-model-len", "512",
         "--num-blocks", "2048", "--block-size", "16"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)


def start_gateway(backends: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0",
           "--heartbeat-timeout", "1.5", "--request-timeout", "60", "--log-level", "warning"]
    for b in backends:
        cmd += ["--backend", b]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    line = proc.stdout.readline()
    m = re.search(r"on (http://[\d.]+:\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"gateway did not start: {line!r}")
    return proc, m.group(1)


@dataclass
class Tally:
    sent: int = 0
    finished: int = 0               # a finish_reason and [DONE]
    errors: dict = field(default_factory=dict)  # error code -> count
    lost: int = 0                   # no terminal answer before the client's own timeout
    double: int = 0                 # more than one terminal answer
    tokens: int = 0


async def one_stream(session: aiohttp.ClientSession, url: str, rng: random.Random,
                     tally: Tally) -> None:
    body = {"prompt": "chaos " * rng.randint(1, 8), "max_tokens": rng.randint(16, 64),
            "stream": True, "temperature": 0}
    tally.sent += 1
    terminals = 0
    try:
        async with session.post(f"{url}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=90)) as resp:
            if resp.status != 200:
                code = (await resp.json())["error"]["code"]
                tally.errors[code] = tally.errors.get(code, 0) + 1
                return
            done = errored = False
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    terminals += 1
                    errored = True
                    code = event["error"]["code"]
                    tally.errors[code] = tally.errors.get(code, 0) + 1
                    continue
                for c in event["choices"]:
                    tally.tokens += 1
                    if c.get("finish_reason"):
                        terminals += 1
            # an errored stream also ends with [DONE] after its error event (as vLLM's does)
            if done and terminals == 1 and not errored:
                tally.finished += 1
    except (asyncio.TimeoutError, aiohttp.ClientError):
        tally.lost += 1
        return
    if terminals == 0:
        tally.lost += 1
    elif terminals > 1:
        tally.double += 1


async def load(url: str, streams: int, stop: asyncio.Event, tally: Tally) -> None:
    async def worker(i: int) -> None:
        rng = random.Random(i)
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                await one_stream(session, url, rng, tally)

    await asyncio.gather(*(worker(i) for i in range(streams)))


async def metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text()


def gauge(text: str, name: str, backend: str) -> float | None:
    m = re.search(rf'^{re.escape(name)}{{backend="{re.escape(backend)}"}} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else None


async def run_chaos(streams: int = 64, scale: float = 1.0, step_ms: float = 5.0) -> dict:
    """The whole scenario; returns the figures (see main)."""
    tmp = tempfile.mkdtemp(prefix="tg-chaos-")
    addrs = [f"ipc://{tmp}/b{i}.sock" for i in range(3)]
    logs = [Path(tmp) / f"b{i}.log" for i in range(3)]
    procs = [start_backend(a, step_ms, log) for a, log in zip(addrs, logs)]
    for p in procs:
        if "ready" not in p.stdout.readline():
            raise RuntimeError("a backend did not start")
    gw, url = start_gateway(addrs)
    tally = Tally()
    stop = asyncio.Event()
    events = []
    try:
        runner = asyncio.create_task(load(url, streams, stop, tally))

        async def at(t: float, what: str, action) -> None:
            await asyncio.sleep(t * scale - (time.monotonic() - t0))
            action()
            events.append((round(time.monotonic() - t0, 2), what))

        t0 = time.monotonic()
        await at(2, "kill -9 backend 0", lambda: procs[0].send_signal(signal.SIGKILL))
        await at(4, "SIGSTOP backend 1", lambda: procs[1].send_signal(signal.SIGSTOP))
        await at(7, "SIGCONT backend 1", lambda: procs[1].send_signal(signal.SIGCONT))

        def restart() -> None:
            procs[0].wait()
            procs[0] = start_backend(addrs[0], step_ms, logs[0])

        await at(8, "restart backend 0", restart)
        await at(12, "stop the load", stop.set)
        await asyncio.wait_for(runner, 120)
        # idle now: every backend must report all its blocks free and be healthy again (the
        # restarted one may still be importing on a busy machine: a generous deadline)
        deadline = time.monotonic() + 60
        while True:
            text = await metrics(url)
            kv = [gauge(text, "tidegate_backend_kv_cache_usage_perc", a) for a in addrs]
            up = [gauge(text, "tidegate_backend_healthy", a) for a in addrs]
            if (all(u == 1.0 for u in up) and all(k == 0.0 for k in kv)) or \
                    time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        # the restarted backend serves again: a burst lands on all three
        after = Tally()
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(one_stream(session, url, random.Random(1000 + i), after)
                                   for i in range(12)))
        retried = re.search(r"^tidegate_retried_requests_total (\S+)$", text, re.MULTILINE)
        return {
            "logs": tmp, "streams": streams, "events": events, "requests": tally.sent,
            "finished": tally.finished, "errors": tally.errors, "lost": tally.lost,
            "answered_twice": tally.double, "tokens": tally.tokens,
            "retried": float(retried.group(1)) if retried else 0.0,
            "kv_usage_after": dict(zip(addrs, kv)), "healthy_after": dict(zip(addrs, up)),
            "running_after": {a: (gauge(text, "tidegate_backend_num_requests_running", a),
                                  gauge(text, "tidegate_backend_num_requests_waiting", a))
                              for a in addrs},
            "after_restart": {"requests": after.sent, "finished": after.finished,
                              "errors": after.errors, "lost": after.lost},
        }
    finally:
        stop.set()
        gw.send_signal(signal.SIGTERM)
        try:
            gw.wait(30)
        except subprocess.TimeoutExpired:
            gw.kill()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--scale", type=float, default=1.0, help="stretch the timeline")
    p.add_argument("--step-ms", type=float, default=5.0, help="echo backend step time")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = asyncio.run(run_chaos(args.streams, args.scale, args.step_ms))
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = (result["lost"] == 0 and result["answered_twice"] == 0
          and all(v == 0.0 for v in result["kv_usage_after"].values())
          and all(v == 1.0 for v in result["healthy_after"].values())
          and result["after_restart"]["finished"] == result["after_restart"]["requests"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
