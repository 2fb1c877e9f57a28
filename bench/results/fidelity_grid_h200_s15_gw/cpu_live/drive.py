"""Issue 35, session 15 (H35G): the gateway's window timer against its loop's per-stream work, live on the
CPU box. One echo backend (a constant step, `--echo-step-ms`), one gateway with a decision log, the
backend's step log; Poisson arrivals of 32-token prompts streaming OUT tokens each, at rising rates so
that ~8 / 24 / 48 streams run at once. Per run: the gateway process's CPU seconds per streamed token (its
loop's cost a stream a step: /proc/PID/stat utime + stime over the run), and the run's span on the
monotonic clock (the decision log's clock), and every token chunk's arrival at the client
(chunks_K.npy: the echo engine logs no steps; a step's tokens reach the client as one burst, which is
the gateway loop's job for that step seen from the client). `analyze.py` reads them.

    python drive.py OUT [--rates 4,12,24] [--seconds 30] [--out-tokens 100] [--step-ms 20]
"""
import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from bench.serving.loadgen import HttpTarget, run_http

TG = [str(ROOT / ".venv/bin/tidegate")]


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--rates", default="4,12,24")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--out-tokens", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--port", type=int, default=18435)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sock = f"ipc:///tmp/h35g_echo_{os.getpid()}.sock"
    be_log, gw_log = open(out / "backend.log", "w"), open(out / "gateway.log", "w")  # noqa: SIM115
    be = subprocess.Popen(TG + ["backend", "--listen", sock, "--model", "echo", "--device", "cpu",
                                "--echo-step-ms", str(a.step_ms), "--max-num-seqs", "256",
                                "--step-log", str(out / "steps.jsonl")],
                          stdout=be_log, stderr=subprocess.STDOUT)
    gw = subprocess.Popen(TG + ["serve", "--port", str(a.port), "--backend", sock, "--min-latency-ms", "5",
                                "--target-throughput", "100", "--decision-log", str(out / "decisions.jsonl"),
                                "--log-level", "warning"],
                          stdout=gw_log, stderr=subprocess.STDOUT)
    runs = []
    try:
        import urllib.request
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{a.port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        target = HttpTarget(url=f"http://127.0.0.1:{a.port}")
        for k, rate in enumerate(float(x) for x in a.rates.split(",")):
            rng = np.random.default_rng(k)
            n = int(rate * a.seconds)
            offsets = np.cumsum(rng.exponential(1.0 / rate, n))
            prompts = [[1 + (j % 50) for j in range(32)] for _ in range(n)]
            c0, t0 = cpu_s(gw.pid), time.monotonic()
            recs, _, _ = asyncio.run(run_http(target, offsets, prompts, [a.out_tokens] * n))
            c1, t1 = cpu_s(gw.pid), time.monotonic()
            ok = [r for r in recs if r.ok]
            # every token chunk's arrival at the client (the echo engine logs no steps: a step's
            # tokens reach the client as one burst, the gateway's job on its loop; analyze.py)
            np.save(out / f"chunks_{k}.npy", np.sort(np.concatenate([np.array(r.chunk_times) for r in ok])))
            tokens = sum(r.output_tokens for r in ok)
            ttft = [1e3 * (r.first_token_time - r.send_time) for r in ok]
            runs.append({"rate": rate, "n": n, "ok": len(ok), "t0": t0, "t1": t1, "gateway_cpu_s": c1 - c0,
                         "tokens": tokens, "cpu_ms_per_token": 1e3 * (c1 - c0) / max(1, tokens),
                         "ttft_p50_ms": float(np.median(ttft)) if ttft else None,
                         "loadavg": os.getloadavg()})
            print(json.dumps(runs[-1]), flush=True)
            time.sleep(2.0)
    finally:
        gw.send_signal(signal.SIGINT)
        be.send_signal(signal.SIGINT)
        for proc in (gw, be):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        be_log.close()
        gw_log.close()
    (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
