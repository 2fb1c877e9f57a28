"""Soak (issue 13): moderate mixed load for a long time, sampling what leaks show up in.

    .venv/bin/python -m bench.reliability.soak --minutes 30 --out bench/results/soak-30min
    .venv/bin/python -m bench.reliability.soak --minutes 2 --interval 10     # the CI form's size

`tidegate serve` (HTTP + the ZMQ front door) over two echo backends (`--echo-step-ms`: the real
worker loop and KV accounting, a step that sleeps). Load, all the time: HTTP streams and plain
requests, a share of streams dropped by the client mid-way (aborts), a share of bad requests
(400s), and ZMQ clients that generate and break out of streams. Every `--interval` seconds it
samples the gateway's RSS, open file descriptors and asyncio tasks (from its /metrics), the
front door's open requests, and each backend's KV usage, RSS and descriptors (/proc). At the
end the load stops, and once idle a last sample must show every KV block free, no front-door
request open and the task count back at its baseline. Writes samples.csv, summary.json and
soak.png into --out.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gateway.client import AsyncClient, TidegateError


def start_backend(address: str, step_ms: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "backend", "--model", "echo",
         "--echo-step-ms", str(step_ms), "--listen", address, "--max-model-len", "512",
         "--num-blocks", "4096"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)


def proc_stats(pid: int) -> tuple[float, int]:
    """(RSS MiB, open fds) of a process from /proc."""
    with open(f"/proc/{pid}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else float("nan")


class Load:
    def __init__(self, url: str, door: str, http_workers: int, zmq_workers: int) -> None:
        self.url, self.door = url, door
        self.http_workers, self.zmq_workers = http_workers, zmq_workers
        self.stop = asyncio.Event()
        self.counts: dict[str, int] = {}

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def http(self, i: int) -> None:
        rng = random.Random(i)
        async with aiohttp.ClientSession() as s:
            while not self.stop.is_set():
                roll = rng.random()
                body = {"prompt": "soak " * rng.randint(1, 20),
                        "max_tokens": rng.randint(8, 64), "stream": roll < 0.6}
                if roll > 0.95:
                    body["temperature"] = 9  # a 400
                try:
                    async with s.post(f"{self.url}/v1/completions", json=body) as r:
                        if not body["stream"] or r.status != 200:
                            await r.read()
                            self.count(str(r.status))
                            continue
                        n = 0
                        async for _ in r.content:
                            n += 1
                            if roll < 0.1 and n == 3:  # the client goes away mid-stream
                                break
                        self.count("dropped" if roll < 0.1 and n >= 3 else "200-stream")
                except aiohttp.ClientError:
                    self.count("client_error")

    async def zmq(self, i: int) -> None:
        rng = random.Random(1000 + i)
        async with AsyncClient(self.door, timeout=60) as c:
            while not self.stop.is_set():
                try:
                    if rng.random() < 0.3:
                        async for _ in c.stream("soak", max_tokens=64, ignore_eos=True):
                            break  # an abort at the front door
                        self.count("zmq-abort")
                    else:
                        await c.generate("soak " * rng.randint(1, 10),
                                         max_tokens=rng.randint(8, 64))
                        self.count("zmq-ok")
                except TidegateError as exc:
                    self.count(f"zmq-{exc.code}")

    async def run(self) -> None:
        await asyncio.gather(*(self.http(i) for i in range(self.http_workers)),
                             *(self.zmq(i) for i in range(self.zmq_workers)))


async def sample(url: str, gw_pid: int, backends: list[tuple[str, subprocess.Popen]],
                 t0: float) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    row = {"t_s": round(time.monotonic() - t0, 1),
           "loadavg_1m": os.getloadavg()[0],  # the machine is shared: what the others ran
           "gateway_rss_mib": metric(text, "process_resident_memory_bytes") / 2**20,
           "gateway_fds": metric(text, "process_open_fds"),
           "gateway_tasks": metric(text, "tidegate_event_loop_tasks"),
           "frontdoor_open": metric(text, "tidegate_frontdoor_open_requests")}
    for i, (addr, p) in enumerate(backends):
        rss, fds = proc_stats(p.pid)
        row[f"b{i}_kv_usage"] = metric(text, "tidegate_backend_kv_cache_usage_perc",
                                       f'{{backend="{addr}"}}')
        row[f"b{i}_rss_mib"] = rss
        row[f"b{i}_fds"] = fds
    return row


def drift(rows: list[dict], key: str) -> dict:
    """First and last tenth of the loaded samples (after a one-sample warm-up), and the least-
    squares slope per hour."""
    xs = [r["t_s"] for r in rows]
    ys = [r[key] for r in rows]
    k = max(1, len(ys) // 10)
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 3600
    return {"first": sum(ys[:k]) / k, "last": sum(ys[-k:]) / k, "slope_per_hour": slope,
            "min": min(ys), "max": max(ys)}


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    fig, ax = plt.subplots(3, 2, figsize=(11, 10), sharex=True)
    # each process's RSS on its own scale: a MiB of drift must be visible
    panels = [("gateway RSS (MiB)", ["gateway_rss_mib"]),
              ("backend RSS (MiB)", ["b0_rss_mib", "b1_rss_mib"]),
              ("open file descriptors", ["gateway_fds", "b0_fds", "b1_fds"]),
              ("asyncio tasks / open front-door requests", ["gateway_tasks", "frontdoor_open"]),
              ("KV cache usage (0..1)", ["b0_kv_usage", "b1_kv_usage"]),
              ("machine load average, 1 min (2 cores, shared)", ["loadavg_1m"])]
    for a, (name, keys) in zip(ax.flat, panels):
        keys = [k for k in keys if k in rows[0]]
        top = 0.0
        for key in keys:
            ys = [float(r[key]) for r in rows]
            top = max(top, *ys)
            a.plot(t, ys, label=key, lw=1.2)
        a.set_title(name, fontsize=10)
        if keys:
            a.legend(fontsize=7, loc="lower right")
        a.set_ylim(0, top * 1.15 or 1.0)  # from 0, so the drift is seen to scale
    for a in ax[2]:
        a.set_xlabel("minutes")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run_soak(minutes: float, interval_s: float, out: Path | None, http_workers: int = 6,
                   zmq_workers: int = 2, step_ms: float = 10.0) -> dict:
    tmp = tempfile.mkdtemp(prefix="tg-soak-")
    addrs = [f"ipc://{tmp}/b{i}.sock" for i in range(2)]
    procs = [start_backend(a, step_ms) for a in addrs]
    for p in procs:
        if "ready" not in p.stdout.readline():
            raise RuntimeError("a backend did not start")
    door = f"ipc://{tmp}/door.sock"
    cmd = [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0",
           "--zmq-listen", door, "--log-level", "warning"]
    for a in addrs:
        cmd += ["--backend", a]
    gw = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,  # noqa: ASYNC220
                          text=True)
    try:
        url = re.search(r"on (http://[\d.]+:\d+)", gw.stdout.readline()).group(1)
        backends = list(zip(addrs, procs))
        t0 = time.monotonic()
        baseline = await sample(url, gw.pid, backends, t0)
        load = Load(url, door, http_workers, zmq_workers)
        runner = asyncio.create_task(load.run())
        rows = []
        end = t0 + minutes * 60
        while time.monotonic() < end:
            await asyncio.sleep(min(interval_s, max(0.0, end - time.monotonic())))
            rows.append(await sample(url, gw.pid, backends, t0))
            if runner.done():
                runner.result()  # a crashed load generator is a failed soak
        load.stop.set()
        await asyncio.wait_for(runner, 120)
        final = None
        for _ in range(100):  # idle: every request has ended, every block is back
            await asyncio.sleep(0.2)
            final = await sample(url, gw.pid, backends, t0)
            if final["frontdoor_open"] == 0 and all(final[f"b{i}_kv_usage"] == 0
                                                    for i in range(2)):
                break
        num_requests = sum(load.counts.values())
        summary = {
            "minutes": minutes, "interval_s": interval_s, "samples": len(rows),
            "http_workers": http_workers, "zmq_workers": zmq_workers,
            "requests": load.counts, "requests_per_s": num_requests / (minutes * 60),
            "baseline": baseline, "final_idle": final,
            "drift": {k: drift(rows, k) for k in rows[0] if k != "t_s"},
        }
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "samples.csv", "w", newline="") as f:  # noqa: ASYNC230
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            plot(rows, out / "soak.png", f"tidegate soak: {minutes:g} min, {num_requests} "
                 f"requests ({num_requests / (minutes * 60):.1f}/s), sampled every "
                 f"{interval_s:g} s")
        return summary
    finally:
        gw.send_signal(signal.SIGTERM)
        try:
            gw.wait(30)
        except subprocess.TimeoutExpired:
            gw.kill()
        for p in procs:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--out", default=None, help="directory for samples.csv, summary.json, soak.png")
    p.add_argument("--http-workers", type=int, default=6)
    p.add_argument("--zmq-workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--replot", default=None, help="only redraw soak.png from DIR/samples.csv")
    args = p.parse_args(argv)
    if args.replot:
        out = Path(args.replot)
        with open(out / "samples.csv") as f:
            rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
        s = json.loads((out / "summary.json").read_text())
        n = sum(s["requests"].values())
        plot(rows, out / "soak.png", f"tidegate soak: {s['minutes']:g} min, {n} requests "
             f"({n / (s['minutes'] * 60):.1f}/s), sampled every {s['interval_s']:g} s")
        return 0
    summary = asyncio.run(run_soak(args.minutes, args.interval,
                                   Path(args.out) if args.out else None, args.http_workers,
                                   args.zmq_workers, args.step_ms))
    print(json.dumps({k: summary[k] for k in ("samples", "requests", "requests_per_s",
                                              "final_idle")}, indent=2))
    for key, d in summary["drift"].items():
        print(f"{key:>18}: first {d['first']:9.2f}  last {d['last']:9.2f}  "
              f"slope {d['slope_per_hour']:+9.2f}/h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
