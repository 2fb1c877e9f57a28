"""Where a ZMQ client's 1-token round trip goes, hop by hop (`python -m bench.serving.hop_trace`).

    python -m bench.serving.hop_trace --requests 2000            # echo backend, sync Client, C = 1

Starts `tidegate backend --model echo` and `tidegate serve --backend ipc://…` as two processes
(the embedded set-up, with the backend started by hand so that it can be traced too), then sends
`--requests` 1-token requests one at a time with `gateway.client.Client`. Each process stamps
`time.perf_counter_ns()` (CLOCK_MONOTONIC: one clock for every process on the machine) at:

  client_send   the client calls generate()
  door_in       the front door's reader gets the request           (gateway)
  to_backend    the Batch is handed to the backend socket (validation, queues, batcher and
                placement done; encoding and the send follow)
  backend_in    the worker's loop reads the Batch                  (backend)
  backend_sends the step is done and its StepOutput is being built and sent
  pool_in       the gateway's backend reader gets the StepOutput   (gateway)
  to_client     the front door starts sending the client its StepOutput
  client_done   generate() returns

Sends are stamped as they begin: the far side may read a message before the send call
returns, so a stamp after it could come later than the receiver's.

and the table gives each hop's P50 / P90 / P99 / max in µs over the requests, the end-to-end
figures, and which hop the slowest 1% of requests lost their time in. Hops between processes
include the zmq I/O threads, the kernel and the scheduler's wake-up; hops inside one are Python.
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HOPS = ("client_send", "door_in", "to_backend", "backend_in", "backend_sends", "pool_in",
        "to_client", "client_done")
PROMPT = [104, 101, 108, 108, 111, 32, 119, 111]
_events: list[tuple[str, int]] = []
_now = time.perf_counter_ns


def _stamp_before(cls, name: str, event: str, when=None) -> None:
    """Wrap `cls.name` to stamp `event` as it is called (`when(args)`: only if true)."""
    fn = getattr(cls, name)

    def wrapped(*args, **kwargs):
        if when is None or when(args):
            _events.append((event, _now()))
        return fn(*args, **kwargs)
    setattr(cls, name, wrapped)


def _dump(path: str) -> None:
    with open(path, "w") as fh:
        json.dump(_events, fh)


def run_gateway(out: str, argv: list[str]) -> int:
    from gateway.backend_pool import BackendPool
    from gateway.frontdoor import FrontDoor
    from gateway.tidegate_cli import main as tidegate_main

    _stamp_before(FrontDoor, "_on_message", "door_in")
    _stamp_before(BackendPool, "send_batch", "to_backend")
    _stamp_before(BackendPool, "_handle", "pool_in", lambda a: a[2].kind == "step_output")
    _stamp_before(FrontDoor, "_flush", "to_client")
    try:
        return tidegate_main(argv)
    finally:
        _dump(out)


def run_backend(out: str, argv: list[str]) -> int:
    from backend.server.worker import Worker
    from gateway.tidegate_cli import main as tidegate_main

    _stamp_before(Worker, "_handle", "backend_in")
    _stamp_before(Worker, "_send_step_output", "backend_sends")
    try:
        return tidegate_main(argv)
    finally:
        _dump(out)


def _child(args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "bench.serving.hop_trace", *args], cwd=REPO_ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{log.name}: no {text!r}:\n{log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def match(client: list[tuple[int, int]], events: list[tuple[str, int]]) -> list[dict[str, int]]:
    """Each client request's stamps: for every hop in path order, its first stamp at or after
    the previous hop's, inside [client_send, client_done] (one request at a time). A request
    missing a stamp (e.g. the gateway's last flush after the client already left) is dropped."""
    times = {hop: sorted(t for name, t in events if name == hop) for hop in HOPS[1:-1]}
    rows = []
    for t0, t1 in client:
        row, last = {"client_send": t0}, t0
        for hop in HOPS[1:-1]:
            ts = times[hop]
            k = bisect.bisect_left(ts, last)
            if k == len(ts) or ts[k] > t1:
                break
            row[hop] = last = ts[k]
        else:
            row["client_done"] = t1
            rows.append(row)
    return rows


def report(rows: list[dict[str, int]]) -> dict:
    hops = {}
    for a, b in itertools.pairwise(HOPS):
        xs = [(r[b] - r[a]) / 1000 for r in rows]
        hops[f"{a} -> {b}"] = {"p50": _percentile(xs, 50), "p90": _percentile(xs, 90),
                               "p99": _percentile(xs, 99), "max": max(xs),
                               "mean": sum(xs) / len(xs)}
    total = [(r["client_done"] - r["client_send"]) / 1000 for r in rows]
    cut = _percentile(total, 99)
    slow = [r for r, t in zip(rows, total) if t >= cut]
    # where the slowest 1% lost their time: each hop's mean over them, minus its median
    tail = {name: sum((r[b] - r[a]) / 1000 for r in slow) / len(slow) - hops[name]["p50"]
            for name, (a, b) in zip(hops, itertools.pairwise(HOPS))}
    return {"requests": len(rows), "hops_us": hops,
            "total_us": {"p50": _percentile(total, 50), "p90": _percentile(total, 90),
                         "p99": cut, "max": max(total)},
            "slowest_1pct_excess_us": tail, "loadavg": os.getloadavg()}


def format_report(rep: dict) -> str:
    lines = [f"{rep['requests']} requests, load average {rep['loadavg'][0]:.2f}",
             f"{'hop':<28} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>9}  slowest 1%: +us"]
    for name, h in rep["hops_us"].items():
        lines.append(f"{name:<28} {h['p50']:8.1f} {h['p90']:8.1f} {h['p99']:8.1f} {h['max']:9.1f}"
                     f"  {rep['slowest_1pct_excess_us'][name]:+9.1f}")
    t = rep["total_us"]
    lines.append(f"{'round trip':<28} {t['p50']:8.1f} {t['p90']:8.1f} {t['p99']:8.1f} "
                 f"{t['max']:9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_gateway":
        return run_gateway(argv[1], argv[2:])
    if argv and argv[0] == "_backend":
        return run_backend(argv[1], argv[2:])
    p = argparse.ArgumentParser(prog="python -m bench.serving.hop_trace", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--gateway-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tidegate-hops-"))
    backend_addr = f"ipc://{tmp}/backend.sock"
    door = f"ipc://{tmp}/door.sock"
    backend = _child(["_backend", str(tmp / "backend.json"), "backend", "--model", "echo",
                      "--listen", backend_addr], tmp / "backend.log")
    gateway = None
    try:
        _wait_for(tmp / "backend.log", "tidegate backend ready", backend, 120)
        gateway = _child(["_gateway", str(tmp / "gateway.json"), "serve", "--backend",
                          backend_addr, "--port", "0", "--zmq-listen", door,
                          *args.gateway_arg], tmp / "gateway.log")
        _wait_for(tmp / "gateway.log", "ZMQ front door on", gateway, 120)
        from gateway.client import Client

        client = []
        with Client(door) as c:
            for i in range(args.warmup + args.requests):
                t0 = _now()
                c.generate(PROMPT, max_tokens=1, temperature=0.0)
                if i >= args.warmup:
                    client.append((t0, _now()))
    finally:
        if gateway is not None:
            _stop(gateway)
        _stop(backend)
    events = []
    for name in ("gateway.json", "backend.json"):
        events += [tuple(e) for e in json.loads((tmp / name).read_text())]
    rep = report(match(client, events))
    print(format_report(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
