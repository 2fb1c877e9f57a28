"""The serving benchmark of one machine: `tidegate serve` started per configuration, the same
workloads against each with `tidegate bench serve`, and the engine's own step times from the same
run beside what the client saw.

    python -m bench.serving.suite --out OUT --workloads issue11 \\
        --config bf16= --config "fp8=--quantization fp8" \\
        -- --model deepseek-coder-33b --load-format dummy --device cuda

Per configuration: start the server (its embedded backend writes a step log: `--step-log`), wait
for its ready line (the start-up time is measured), run each workload, stop the server (the
backend writes the log as it stops), then cut the log at each workload's start and end. Outputs
under OUT: `CONFIG_WORKLOAD.json` (the load generator's JSON plus an "engine" section), the step
logs, `summary.json` and `serving_table.md`.

What the step times allow, per workload (the "engine" section; a step's time is the worker's
read-back cadence (backend.server.step_log): its device time plus whatever the device waited for the
host — with async scheduling on CUDA, about its device time alone):
- allowed output tok/s = output tokens / the sum of step times in the window: the rate if steps ran
  back to back with no time between them;
- allowed TPOT = the decode-weighted mean step time, sum(ms x decodes) / sum(decodes): the mean gap
  between two tokens of a stream when each step's time is all it waits;
- decode-only and prefill-bearing step times (p50, mean) and counts, the busy fraction of the window.
The serving overhead is then client / allowed (TPOT, ITL) or allowed / client (throughput).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Workload:
    name: str
    input_len: int
    output_len: int
    num_requests: int
    rate: float  # requests/s; inf = all at once

    def bench_argv(self) -> list[str]:
        return ["--input-len", str(self.input_len), "--output-len", str(self.output_len),
                "--num-requests", str(self.num_requests), "--rate", str(self.rate)]


WORKLOADS = {
    # issue 11's four (H200, 33B): a trickle of short requests, a burst of short ones, a steady
    # stream of 512-token prompts, a burst of them
    "issue11": (Workload("short_2rps", 16, 32, 40, 2.0), Workload("short_burst", 16, 32, 256, math.inf),
                Workload("long_8rps", 512, 128, 200, 8.0), Workload("long_burst", 512, 128, 400, math.inf)),
    # issue 32 (H200, the 1.3B preset): the same, the stream of long prompts at 32 req/s
    "issue32": (Workload("short_2rps", 16, 32, 40, 2.0), Workload("short_burst", 16, 32, 256, math.inf),
                Workload("long_32rps", 512, 128, 400, 32.0),
                Workload("long_burst", 512, 128, 400, math.inf)),
    # session 39's FP8 switch (`--fp8-gemv-max-m`, prediction 31): bursts that hold the decode batch at 16 /
    # 24 / 32 / 48 for most of their steps (all arrive at once; 512-token prompts, 256 tokens out), so
    # TPOT is the step of one decode graph: 24 and 32 move with the switch, 16 and 48 are the controls
    "fp8_switch": (Workload("burst16", 512, 256, 16, math.inf), Workload("burst24", 512, 256, 24, math.inf),
                   Workload("burst32", 512, 256, 32, math.inf), Workload("burst48", 512, 256, 48, math.inf)),
    # session 41: below the default switch (16 since then): the 8- and 16-row decode graphs (8 and 12 / 16
    # requests) on the GEMV at 16, on _scaled_mm at 8; 4 is the control (the 4-row graph, GEMV in both)
    "fp8_switch_low": (Workload("burst4", 512, 256, 4, math.inf), Workload("burst8", 512, 256, 8, math.inf),
                       Workload("burst12", 512, 256, 12, math.inf), Workload("burst16", 512, 256, 16, math.inf)),
    # the same shapes, small enough for the tiny model on a CPU (the script's own test)
    "tiny": (Workload("short_2rps", 16, 8, 6, 4.0), Workload("short_burst", 16, 8, 12, math.inf),
             Workload("long_8rps", 64, 16, 6, 4.0), Workload("long_burst", 64, 16, 8, math.inf)),
}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def step_summary(rows: list[dict], t0: float, t1: float) -> dict:
    """The steps that started in [t0, t1) and what their times allow (see the module docstring)."""
    steps = [r for r in rows if t0 <= r["t"] < t1]
    decode_only = [r["ms"] for r in steps if r["prefill_tokens"] == 0 and r["decodes"] > 0]
    with_prefill = [r for r in steps if r["prefill_tokens"] > 0]
    busy_ms = sum(r["ms"] for r in steps)
    sampled = sum(r["decodes"] for r in steps)
    weighted = sum(r["ms"] * r["decodes"] for r in steps)
    out = {
        "num_steps": len(steps), "busy_ms": busy_ms, "window_ms": (t1 - t0) * 1000,
        "busy_fraction": busy_ms / ((t1 - t0) * 1000) if t1 > t0 else 0.0,
        "num_decode_only_steps": len(decode_only),
        "decode_only_ms_p50": _pct(decode_only, 50),
        "decode_only_ms_mean": statistics.fmean(decode_only) if decode_only else float("nan"),
        "decode_only_batch_mean": (statistics.fmean(r["decodes"] for r in steps
                                                    if r["prefill_tokens"] == 0 and r["decodes"] > 0)
                                   if decode_only else 0.0),
        "num_prefill_steps": len(with_prefill),
        "prefill_step_ms_mean": (statistics.fmean(r["ms"] for r in with_prefill)
                                 if with_prefill else float("nan")),
        "prefill_step_ms_p50": _pct([r["ms"] for r in with_prefill], 50),
        "prefill_tokens_per_step_mean": (statistics.fmean(r["prefill_tokens"] for r in with_prefill)
                                         if with_prefill else 0.0),
        "decode_b1_ms_p50": _pct([r["ms"] for r in steps
                                  if r["prefill_tokens"] == 0 and r["decodes"] == 1], 50),
        "num_decode_b1_steps": sum(1 for r in steps if r["prefill_tokens"] == 0 and r["decodes"] == 1),
        "step_ms_p50": _pct([r["ms"] for r in steps], 50),
        "step_ms_p99": _pct([r["ms"] for r in steps], 99),
        "step_ms_max": max((r["ms"] for r in steps), default=float("nan")),
        # the mean step a decoding token waits for
        "allowed_tpot_ms": weighted / sampled if sampled else float("nan"),
    }
    out.update(device_summary(steps))
    return out


def device_summary(steps: list[dict]) -> dict:
    """The steps' own device time (`device_ms`: CUDA timing events around each greedy step,
    logged where known) beside their read-back cadence (`ms`): the cadence minus the device
    time is what a step waited for the host (a late launch), so the two tell a slower device
    (clocks, compute) from a late host."""
    timed = [r for r in steps if r.get("device_ms") is not None]
    decode = [r["device_ms"] for r in timed if r["prefill_tokens"] == 0 and r["decodes"] > 0]
    return {
        "num_device_timed_steps": len(timed),
        "device_ms_sum": sum(r["device_ms"] for r in timed),
        # cadence beyond device time, summed: the device idle between steps, as the loop saw it
        "host_wait_ms_sum": sum(max(0.0, r["ms"] - r["device_ms"]) for r in timed),
        "decode_only_device_ms_p50": _pct(decode, 50),
        "decode_only_device_ms_max": max(decode, default=float("nan")),
        "prefill_step_device_ms_mean": (
            statistics.fmean(r["device_ms"] for r in timed if r["prefill_tokens"] > 0)
            if any(r["prefill_tokens"] > 0 for r in timed) else float("nan")),
        **device_idle_summary(steps),
    }


def device_idle_summary(steps: list[dict]) -> dict:
    """The device's idle time before each step (`device_idle_ms`: from the step before's
    read-back copy to this step's start, on the device's own clock; issue 32) as a share of the
    steps' device time: overall and for decode-only steps of 48-80 sequences (batch ~64)."""
    idle = [r for r in steps if r.get("device_idle_ms") is not None and r.get("device_ms")]

    def share(rows):
        busy = sum(r["device_ms"] for r in rows)
        return sum(r["device_idle_ms"] for r in rows) / busy if busy else float("nan")

    b64 = [r for r in idle if r["prefill_tokens"] == 0 and 48 <= r["decodes"] <= 80]
    return {
        "num_device_idle_steps": len(idle),
        "device_idle_ms_sum": sum(r["device_idle_ms"] for r in idle),
        "device_idle_fraction": share(idle),
        "device_idle_ms_p50": _pct([r["device_idle_ms"] for r in idle], 50),
        "num_b64_steps": len(b64),
        "b64_device_ms_p50": _pct([r["device_ms"] for r in b64], 50),
        "b64_device_idle_ms_p50": _pct([r["device_idle_ms"] for r in b64], 50),
        "b64_device_idle_fraction": share(b64),
    }


PREFILL_BINS = (1, 65, 129, 257, 513, 1025, 2049, 1 << 30)


def step_model(rows: list[dict]) -> dict:
    """Over every logged step of one server: mean step time by prefill tokens per step (bins),
    and the least-squares line ms = a + b * prefill_tokens + c * decodes, for the chunk-size
    arithmetic (how long a step with a chunk of N prompt tokens makes every stream wait)."""
    import numpy as np

    bins = {}
    for lo, hi in itertools.pairwise(PREFILL_BINS):
        ms = [r["ms"] for r in rows if lo <= r["prefill_tokens"] < hi]
        if ms:
            toks = [r["prefill_tokens"] for r in rows if lo <= r["prefill_tokens"] < hi]
            bins[f"{lo}-{hi - 1}"] = {"steps": len(ms), "ms_mean": statistics.fmean(ms),
                                      "ms_p50": _pct(ms, 50),
                                      "prefill_tokens_mean": statistics.fmean(toks)}
    used = [r for r in rows if r["prefill_tokens"] + r["decodes"] > 0]
    fit = None
    if len(used) >= 3:
        a = np.array([[1.0, r["prefill_tokens"], r["decodes"]] for r in used])
        y = np.array([r["ms"] for r in used])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        fit = {"a_ms": float(coef[0]), "ms_per_prefill_token": float(coef[1]),
               "ms_per_decode": float(coef[2]), "num_steps": len(used)}
    return {"by_prefill_tokens": bins, "fit": fit}


def read_step_log(path: Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


class Server:
    """`tidegate serve` in a child process; `start()` returns seconds to its ready line."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float) -> float:
        t0 = time.perf_counter()
        self.log = open(self.log_path, "w")  # noqa: SIM115 -- open while the server runs
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0", *self.argv],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.write(line)
            m = re.search(r"serving model .+? on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                return time.perf_counter() - t0
        self.stop()
        raise RuntimeError(f"server did not start (see {self.log_path})")

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
        self.log.write(rest or "")
        self.log.close()
        return self.proc.returncode


def run_seed(workloads: tuple[Workload, ...], w: Workload, k: int) -> int:
    """The prompt seed of the k-th run of workload w: its own per workload and per run. With one
    seed for all, a later workload's first prompts were an earlier one's (the same random tokens),
    so one server's prefix cache served them: the fourth session's 400-burst reused the 200
    prompts of the 8 req/s run before it (200 chunks starting at token 496)."""
    return 1000 * (workloads.index(w) + 1) + k


def run_workload(url: str, w: Workload, json_path: Path, extra: list[str],
                 seed: int = 0) -> tuple[float, float, int]:
    """`tidegate bench serve` for one workload (in a child process, so each run has a fresh
    event loop and its CPU time is its own); returns its wall start, end and exit code.
    `extra` comes after the seed, so a `--seed` in it wins."""
    argv = [sys.executable, "-m", "gateway.tidegate_cli", "bench", "serve", "--url", url,
            *w.bench_argv(), "--seed", str(seed), "--json", str(json_path), "--no-progress",
            *extra]
    t0 = time.time()
    done = subprocess.run(argv, cwd=ROOT, check=False)
    return t0, time.time(), done.returncode


def _fmt(x, nd=1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def table(rows: list[dict]) -> str:
    head = ("| config | workload | TTFT p50 ms | ITL p50 / p99 ms | TPOT p50 ms | out tok/s | "
            "steps (prefill) | decode step p50 ms (device) | prefill step mean ms | allowed TPOT ms | "
            "allowed tok/s | TPOT / allowed | tok/s / allowed | device idle / busy |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        c, e = r["client"], r["engine"]
        allowed_tps = r["total_output_tokens"] / (e["busy_ms"] / 1000) if e["busy_ms"] else None
        lines.append(
            f"| {r['config']} | {r['workload']} | {_fmt(c['ttft_p50'])} | "
            f"{_fmt(c['itl_p50'])} / {_fmt(c['itl_p99'])} | {_fmt(c['tpot_p50'])} | "
            f"{_fmt(c['output_throughput'], 0)} | {e['num_steps']} ({e['num_prefill_steps']}) | "
            f"{_fmt(e['decode_only_ms_p50'], 2)} ({_fmt(e.get('decode_only_device_ms_p50'), 2)}) | "
            f"{_fmt(e['prefill_step_ms_mean'], 2)} | "
            f"{_fmt(e['allowed_tpot_ms'], 2)} | {_fmt(allowed_tps, 0)} | "
            f"{_fmt(c['tpot_p50'] / e['allowed_tpot_ms'], 2) if e['allowed_tpot_ms'] else '–'} | "
            f"{_fmt(c['output_throughput'] / allowed_tps, 2) if allowed_tps else '–'} | "
            f"{_fmt(e.get('device_idle_fraction'), 3)} |")
    return "\n".join(lines)


def issue32_goals(rows: list[dict]) -> str:
    """Issue 32's H200 goals (1.3B preset), met or not, for every configuration."""
    lines = ["| config | goal | measured | met |", "|---|---|---|---|"]
    for r in rows:
        c, e, w = r["client"], r["engine"], r["workload"]
        goals = []
        if w == "short_2rps":
            goals.append(("16/32 at 2 req/s: ITL p50 <= 1.0 ms", f"{c['itl_p50']:.3f} ms",
                          c["itl_p50"] <= 1.0))
        if e.get("num_b64_steps"):
            f = e["b64_device_idle_fraction"]
            goals.append(((f"{w}: device idle <= 10% of the step at batch 48-80 "
                          f"({e['num_b64_steps']} steps)"),
                          (f"{e['b64_device_idle_ms_p50']:.3f} ms idle p50 / "
                          f"{e['b64_device_ms_p50']:.3f} ms step p50; sum {f:.1%}"), f <= 0.10))
        if w == "long_burst" and e["busy_ms"]:
            allowed = r["total_output_tokens"] / (e["busy_ms"] / 1000)
            goals.append(("512/128, 400 at once: within 15% of what the step times allow",
                          (f"{c['output_throughput']:,.0f} / {allowed:,.0f} = "
                          f"{c['output_throughput'] / allowed:.0%}"),
                          c["output_throughput"] >= 0.85 * allowed))
        lines += [f"| {r['config']} | {g} | {m} | {'yes' if ok else 'no'} |" for g, m, ok in goals]
    return "\n".join(lines)


def issue11_goals(rows: list[dict]) -> str:
    """Issue 11's serving goals, met or not, for every configuration that ran the workload."""
    lines = ["| config | goal | measured | met |", "|---|---|---|---|"]

    def add(r, goal, measured, ok):
        lines.append(f"| {r['config']} | {goal} | {measured} | {'yes' if ok else 'no'} |")

    for r in rows:
        c, e, w = r["client"], r["engine"], r["workload"]
        allowed_tps = r["total_output_tokens"] / (e["busy_ms"] / 1000) if e["busy_ms"] else 0.0
        if w == "short_2rps":
            add(r, "16/32 at 2 req/s: TTFT p50 <= 30 ms", f"{c['ttft_p50']:.1f} ms",
                c["ttft_p50"] <= 30)
            add(r, "16/32 at 2 req/s: ITL p99 <= 1.3 x ITL p50",
                f"{c['itl_p99']:.1f} / {c['itl_p50']:.1f} = {c['itl_p99'] / c['itl_p50']:.2f}x",
                c["itl_p99"] <= 1.3 * c["itl_p50"])
        elif w == "short_burst":
            add(r, "16/32, 256 at once: >= 5,000 output tok/s",
                f"{c['output_throughput']:,.0f} tok/s", c["output_throughput"] >= 5000)
            add(r, "16/32, 256 at once: TPOT p50 <= 35 ms", f"{c['tpot_p50']:.1f} ms",
                c["tpot_p50"] <= 35)
        elif w == "long_8rps":
            add(r, "512/128 at 8 req/s: TPOT p50 within 10% of what the step times allow",
                f"{c['tpot_p50']:.1f} ms vs {e['allowed_tpot_ms']:.1f} ms allowed = "
                f"{c['tpot_p50'] / e['allowed_tpot_ms']:.2f}x",
                c["tpot_p50"] <= 1.1 * e["allowed_tpot_ms"])
            add(r, "512/128 at 8 req/s: ITL p99 <= 2.5 x ITL p50",
                f"{c['itl_p99']:.1f} / {c['itl_p50']:.1f} = {c['itl_p99'] / c['itl_p50']:.2f}x",
                c["itl_p99"] <= 2.5 * c["itl_p50"])
        elif w == "long_burst":
            add(r, "512/128, 400 at once: >= 1,700 output tok/s",
                f"{c['output_throughput']:,.0f} tok/s", c["output_throughput"] >= 1700)
            add(r, "512/128, 400 at once: >= 85% of what the step times allow",
                f"{c['output_throughput']:,.0f} / {allowed_tps:,.0f} = "
                f"{c['output_throughput'] / allowed_tps:.0%}" if allowed_tps else "–",
                bool(allowed_tps) and c["output_throughput"] >= 0.85 * allowed_tps)
    return "\n".join(lines)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    serve_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, serve_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m bench.serving.suite", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSONs, step logs and the table")
    p.add_argument("--workloads", default="issue11", choices=sorted(WORKLOADS))
    p.add_argument("--only", default=None, help="comma-separated workload names to run (default all)")
    p.add_argument("--config", action="append", default=None, metavar="NAME=SERVE_ARGS[@W1,W2]",
                   help="a server configuration: its name, extra `tidegate serve` flags and, "
                        "after @, the only workloads it runs, a name given twice running twice "
                        "(the second as NAME_2; repeatable; default: bf16=)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--bench-arg", action="append", default=[],
                   help="extra flag for every `tidegate bench serve` (repeatable)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="skip what would start after this many seconds (recorded as skipped)")
    args = p.parse_args(argv)
    return args, serve_args


def main(argv: list[str] | None = None) -> int:
    args, serve_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    began = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workloads = WORKLOADS[args.workloads]
    if args.only:
        keep = set(args.only.split(","))
        workloads = tuple(w for w in workloads if w.name in keep)
    configs = []
    for item in args.config or ["bf16="]:
        name, _, extra = item.partition("=")
        extra, _, only = extra.partition("@")
        configs.append((name, shlex.split(extra), only.split(",") if only else None))
    summary: dict = {"serve_args": serve_args, "configs": {}, "skipped": []}
    rows = []
    for name, extra, only in configs:
        if args.deadline_s is not None and time.monotonic() - began > args.deadline_s:
            summary["skipped"].append(name)
            continue
        step_log = out / f"steps_{name}.jsonl"
        server = Server([*serve_args, *extra, "--step-log", str(step_log.resolve()),
                         "--startup-timeout", str(args.startup_timeout)], out / f"server_{name}.log")
        try:
            startup_s = server.start(args.startup_timeout + 30)
        except RuntimeError as exc:  # e.g. flags the backend refuses: the others still run
            print(f"[{name}] {exc}", flush=True)
            summary["skipped"].append(f"{name} (server did not start)")
            continue
        print(f"[{name}] server ready in {startup_s:.1f} s at {server.url}", flush=True)
        windows = []
        try:
            runs = [(w, k) for w in workloads
                    for k in range(1, 2 if only is None else only.count(w.name) + 1)]
            for w, k in runs:
                label = w.name if k == 1 else f"{w.name}_{k}"
                if args.deadline_s is not None and time.monotonic() - began > args.deadline_s:
                    summary["skipped"].append(f"{name}/{label}")
                    continue
                path = out / f"{name}_{label}.json"
                t0, t1, rc = run_workload(server.url, w, path, args.bench_arg,
                                          seed=run_seed(workloads, w, k))
                windows.append((w, path, t0, t1, rc))
                print(f"[{name}] {label}: {t1 - t0:.1f} s, exit {rc}", flush=True)
        except BaseException:  # cut off (SIGINT from a time cap): stop the server all the same
            server.stop()
            raise
        rc = server.stop()
        steps = read_step_log(step_log) if step_log.exists() else []
        summary["configs"][name] = {"startup_s": startup_s, "server_exit": rc,
                                    "serve_extra": extra, "num_logged_steps": len(steps),
                                    "step_model": step_model(steps) if steps else None}
        for w, path, t0, t1, rc in windows:
            if not path.exists():
                summary["skipped"].append(f"{name}/{w.name} (bench exit {rc})")
                continue
            result = json.loads(path.read_text())
            engine = step_summary(steps, t0, t1)
            result["engine"] = engine
            result["workload"] = w.__dict__ | {"rate": "inf" if math.isinf(w.rate) else w.rate}
            path.write_text(json.dumps(result, indent=2) + "\n")
            rows.append({"config": name, "workload": w.name, "json": path.name,
                         "window_wall_s": [t0, t1],
                         "total_output_tokens": result["total_output_tokens"],
                         "completed": result["completed"], "engine": engine,
                         "client": {"ttft_p50": result["ttft_ms"]["p50"],
                                    "itl_p50": result["itl_ms"]["p50"],
                                    "itl_p99": result["itl_ms"]["p99"],
                                    "tpot_p50": result["tpot_ms"]["p50"],
                                    "output_throughput": result["output_throughput"],
                                    "request_throughput": result["request_throughput"]}})
    summary["rows"] = rows
    summary["wall_s"] = time.monotonic() - began
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = table(rows)
    if args.workloads == "issue11":
        text += "\n\n" + issue11_goals(rows)
    elif args.workloads == "issue32":
        text += "\n\n" + issue32_goals(rows)
    (out / "serving_table.md").write_text(text + "\n")
    print(text)
    return 0 if rows and not summary["skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
