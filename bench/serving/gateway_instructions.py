"""The gateway's CPU work per 1-token request as a count of executed instructions
(`python -m bench.serving.gateway_instructions`), which the machine's load does not change.

    python -m bench.serving.gateway_instructions --requests 300       # ~3 min on a 2-core machine

On a shared machine a CPU-seconds figure moves by 2x with the load (the overhead bench's
"server CPU us/request"), so two trees cannot be compared by it. Here the gateway runs under
valgrind's callgrind with instrumentation off until the measured requests begin (start-up is
not counted) and on only while they run; the echo backend and the client run natively. The
client sends one request at a time, so every request takes the same path (no batching, which
depends on timing), and the count per request is the same from run to run within ~1%.

Reported: instructions (valgrind's Ir) per request for the ZMQ client path and the HTTP path
(POST /v1/completions, the body `tidegate bench overhead` sends), each over `--requests`
requests after `--warmup` unmeasured ones. Needs `valgrind` and `callgrind_control` on PATH.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT = [104, 101, 108, 108, 111, 32, 119, 111]  # the overhead bench's prompt
BODY = json.dumps({"model": "echo", "prompt": PROMPT, "max_tokens": 1,
                   "temperature": 0.0}).encode()


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{log.name}: no {text!r}:\n{log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _dumped_ir(outdir: Path, before: set[Path]) -> int:
    """Ir of the dump files written since `before` (callgrind names each dump .N)."""
    total = 0
    for f in set(outdir.glob("callgrind.out*")) - before:
        m = re.search(r"^totals:\s+(\d+)", f.read_text(errors="replace"), re.MULTILINE)
        if m:
            total += int(m.group(1))
    return total


def measure(pid: int, outdir: Path, n: int, one) -> float:
    """Instructions per request over `n` calls of `one()` with instrumentation on."""
    before = set(outdir.glob("callgrind.out*"))
    _control(pid, "--zero")
    _control(pid, "--instr=on")
    for _ in range(n):
        one()
    _control(pid, "--instr=off")
    _control(pid, "--dump")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ir = _dumped_ir(outdir, before)
        if ir:
            return ir / n
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.gateway_instructions",
                                description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tidegate-instr-"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    backend_addr, door = f"ipc://{tmp}/backend.sock", f"ipc://{tmp}/door.sock"
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "backend", "--model", "echo",
         "--listen", backend_addr], cwd=REPO_ROOT, env=env,
        stdout=open(tmp / "backend.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    gateway = None
    try:
        _wait_for(tmp / "backend.log", "tidegate backend ready", backend, 120)
        gateway = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={tmp}/callgrind.out", sys.executable, "-m",
             "gateway.tidegate_cli", "serve", "--backend", backend_addr, "--port", str(port),
             "--host", "127.0.0.1", "--zmq-listen", door], cwd=REPO_ROOT, env=env,
            stdout=open(tmp / "gateway.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
        _wait_for(tmp / "gateway.log", "ZMQ front door on", gateway, 900)
        from gateway.client import Client

        url = f"http://127.0.0.1:{port}/v1/completions"

        def http_one() -> None:
            req = urllib.request.Request(url, BODY, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()

        with Client(door, timeout=120, connect_timeout=120) as c:
            def zmq_one() -> None:
                c.generate(PROMPT, max_tokens=1, temperature=0.0)

            for _ in range(args.warmup):
                zmq_one()
                http_one()
            out = {"zmq_client": measure(gateway.pid, tmp, args.requests, zmq_one),
                   "http_gateway": measure(gateway.pid, tmp, args.requests, http_one)}
    finally:
        if gateway is not None:
            _stop(gateway)
        _stop(backend)
    result = {"instructions_per_request": out, "requests": args.requests, "tree": str(REPO_ROOT)}
    for path, ir in out.items():
        print(f"{path:<14} {ir:>12,.0f} instructions per request (gateway process, "
              f"{args.requests} requests, C = 1)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
