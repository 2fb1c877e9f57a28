"""Issue 14's live check: the same trace through a live gateway in front of N `tidegate backend`s
and through the simulator with the same placement policy, per-backend figures side by side.

    python -m bench.serving.placement_live --workload a --profile out/profile.json --json out/live_a.json

Live: `--backends` processes of `tidegate backend --model MODEL` (ipc sockets; or `--backend-addr`
for backends started elsewhere, e.g. an `http://` vLLM), `tidegate serve` in front of them with
`--placement`, `tidegate bench serve` with the workload's flags; per-backend requests, generated
tokens and prefix-cache hits from the gateway's `/metrics` (`vllm:request_success_total`,
`vllm:generation_tokens_total`, `vllm:prefix_cache_*` per `engine`). Simulated: `python -m sims run`
with the same workload flags and seed (bench and the simulator draw the trace from one generator),
the same placement flags and KV blocks, and the step costs of `--profile` (a `tidegate backend
profile` JSON of this machine) or a constant `--step-ms`.

Workloads (issue 14 §4 scaled down to tiny-coder on this CPU):
  a  8 tenants x 256-token prefix + 32 own tokens, 16 out, 160 requests at 2/s
  b  one hot prefix, the same shapes, 120 requests at 2/s
  c  no shared prefix, 256-token prompts, 64 out, 60 requests at 1/s
  s  no shared prefix, 256-token prompts, 64 out, 96 requests 16 at a time (throughput)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

WORKLOADS = {
    "a": ["--num-requests", "160", "--rate", "2", "--input-len", "288", "--output-len", "16",
          "--shared-prefix-fraction", "1", "--shared-prefix-len", "256",
          "--num-prefix-groups", "8", "--seed", "0"],
    "b": ["--num-requests", "120", "--rate", "2", "--input-len", "288", "--output-len", "16",
          "--shared-prefix-fraction", "1", "--shared-prefix-len", "256",
          "--num-prefix-groups", "1", "--seed", "1"],
    "c": ["--num-requests", "60", "--rate", "1", "--input-len", "256", "--output-len", "64",
          "--seed", "2"],
    # closed loop for throughput comparisons of pools (the mixed tidegate + vLLM pool)
    "s": ["--num-requests", "96", "--rate", "inf", "--max-concurrency", "16", "--input-len", "256",
          "--output-len", "64", "--seed", "3"],
}
_LINE = re.compile(r'^(vllm:[a-z_]+)\{([^}]*)\}\s+([-+0-9.eE]+)$')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_engine(metrics: str) -> dict[str, dict[str, float]]:
    """{engine: {series: value}} of the gateway's per-engine counters (summed over other labels)."""
    want = {"vllm:request_success_total": "requests", "vllm:generation_tokens_total": "generated",
            "vllm:prompt_tokens_total": "prompt_tokens",
            "vllm:prefix_cache_queries_total": "prefix_queries",
            "vllm:prefix_cache_hits_total": "prefix_hits"}
    out: dict[str, dict[str, float]] = {}
    for line in metrics.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) not in want:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        eng = labels.get("engine", "")
        if eng == "gateway":
            continue
        d = out.setdefault(eng, {})
        d[want[m.group(1)]] = d.get(want[m.group(1)], 0.0) + float(m.group(3))
    return out


def wait_http(url: str, timeout: float) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def live(a: argparse.Namespace, wl: list[str], tmp: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [PY, "-m", "gateway.tidegate_cli"]
    procs: list[subprocess.Popen] = []
    addrs = list(a.backend_addr)
    with open(a.log or Path(tmp) / "live.log", "w") as logs:
        try:
            for i in range(a.backends):
                addr = f"ipc://{tmp}/b{i}.sock"
                procs.append(subprocess.Popen(cli + ["backend", "--listen", addr, "--model", a.model,
                                                     "--num-blocks", str(a.num_blocks)],
                                              env=env, stdout=logs, stderr=subprocess.STDOUT))
                addrs.append(addr)
            port = free_port()
            serve = cli + ["serve", "--port", str(port), "--placement", a.placement,
                           "--tokenizer", a.model]
            if a.slack_tokens is not None:
                serve += ["--placement-slack-tokens", str(a.slack_tokens)]
            if a.load_factor is not None:
                serve += ["--placement-load-factor", str(a.load_factor)]
            for addr in addrs:
                serve += ["--backend", addr]
            procs.append(subprocess.Popen(serve, env=env, stdout=logs, stderr=subprocess.STDOUT))
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/v1/models", 600)
            # every backend up before the trace starts (the first batch would otherwise all go to
            # the first one that answered, which the simulator does not model)
            t_end = time.monotonic() + 600
            while len(per_engine_up(url)) < len(addrs) and time.monotonic() < t_end:
                time.sleep(1)
            bench_json = Path(tmp) / "bench.json"
            t0 = time.monotonic()
            subprocess.run(cli + ["bench", "serve", "--url", url, "--json", str(bench_json),
                                  "--no-progress"] + wl, env=env, check=True, stdout=logs,
                           stderr=subprocess.STDOUT)
            wall = time.monotonic() - t0
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                engines = per_engine(r.read().decode())
            bench = json.loads(bench_json.read_text())
        finally:
            stop(procs[::-1])
    return {"wall_s": wall, "engines": engines, "addresses": addrs,
            "bench": {k: bench.get(k) for k in ("completed", "failed", "request_throughput",
                                                "output_throughput", "ttft_ms", "tpot_ms", "itl_ms")}}


def per_engine_up(url: str) -> list[str]:
    """Backends the gateway's /metrics lists as healthy."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return []
    return sorted(set(re.findall(r'tidegate_backend_healthy\{backend="([^"]+)"\}\s+1', text)))


def simulate(a: argparse.Namespace, wl: list[str], tmp: str, nbackends: int) -> dict:
    out = Path(tmp) / "sim.json"
    cmd = [PY, "-m", "sims", "run", "--backends", str(nbackends), "--placement", a.placement,
           "--num-blocks", str(a.num_blocks),
           "--block-size", "16", "--prefix-caching", "on",  # as the live backends
           "--json", str(out)] + wl
    if a.load_factor is not None:
        cmd += ["--placement-load-factor", str(a.load_factor)]
    if a.slack_tokens is not None:
        cmd += ["--placement-slack-tokens", str(a.slack_tokens)]
    cmd += ["--profile", a.profile] if a.profile else ["--step-ms", str(a.step_ms)]
    subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                   stdout=subprocess.DEVNULL)
    rep = json.loads(out.read_text())
    p = rep["placement"]
    return {"backend_requests": p["backend_requests"], "backend_tokens": p["backend_tokens"],
            "backend_prefix_hit_rate": p["backend_prefix_hit_rate"],
            "prefix_hit_rate": rep["kv"]["prefix_hit_rate"], "ttft_ms": rep["ttft_ms"],
            "tpot_ms": rep["tpot_ms"], "cost": a.profile or f"{a.step_ms} ms"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-coder"))
    ap.add_argument("--backends", type=int, default=2, help="tidegate backends to start")
    ap.add_argument("--backend-addr", action="append", default=[],
                    help="a backend started elsewhere (repeatable; live run only)")
    ap.add_argument("--num-blocks", type=int, default=2730)
    ap.add_argument("--placement", default="prefix")
    ap.add_argument("--slack-tokens", type=int, default=None,
                    help="a fixed load-bound slack (default: the policy's, scaled by KV capacity)")
    ap.add_argument("--load-factor", type=float, default=None)
    ap.add_argument("--profile", help="the simulator's cost model (tidegate backend profile JSON)")
    ap.add_argument("--step-ms", type=float, default=50.0, help="without --profile")
    ap.add_argument("--skip-live", action="store_true", help="simulate only")
    ap.add_argument("--skip-sim", action="store_true", help="live only")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--log", help="the live processes' output (default: a temporary file)")
    a = ap.parse_args(argv)
    wl = WORKLOADS[a.workload]
    result: dict = {"workload": a.workload, "flags": wl, "placement": a.placement,
                    "slack_tokens": a.slack_tokens, "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="placement-live-") as tmp:
        if not a.skip_live:
            result["live"] = live(a, wl, tmp)
            result["load_average_after"] = os.getloadavg()
        if not a.skip_sim:
            result["sim"] = simulate(a, wl, tmp, a.backends + len(a.backend_addr))
    if "live" in result:
        engines = result["live"]["engines"]
        order = result["live"]["addresses"]
        live_req = [int(engines.get(e, {}).get("requests", 0)) for e in order]
        live_hits = sum(engines.get(e, {}).get("prefix_hits", 0) for e in order)
        live_q = sum(engines.get(e, {}).get("prefix_queries", 0) for e in order)
        result["live_requests"] = live_req
        result["live_prefix_hit_rate"] = live_hits / live_q if live_q else None
        b = result["live"]["bench"]
        print(f"live requests per backend {live_req}, prefix hit rate "
              f"{result['live_prefix_hit_rate']}, load {result['load_average']}; "
              f"{b['completed']} done, {b['failed']} failed, {b['request_throughput']} req/s, "
              f"{b['output_throughput']} tok/s, TTFT {b['ttft_ms']}, TPOT {b['tpot_ms']}")
    if "sim" in result:
        print(f"sim  requests per backend {result['sim']['backend_requests']}, prefix hit rate "
              f"{result['sim']['prefix_hit_rate']}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
