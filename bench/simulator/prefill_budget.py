"""Issue 11's ITL question in the simulator: which prefill budget per step, at what cost.

Runs issue 11's four serving workloads (bench.serving.suite's `issue11` set: 16/32 at 2 req/s x40,
16/32 x256 at once, 512/128 at 8 req/s x200, 512/128 x400 at once) through the simulator with the
real `StepScheduler` and the measured H200 cost model (33B preset, bf16: the newest profile, its
points charged at the engine's current mixed-step graph buckets), for several step-budget
configurations and seeds, and prints one row per (configuration, workload): TTFT p50, ITL p50 /
p99 and their ratio, TPOT p50, output tok/s, steps (with prefill), the longest step.

    PYTHONPATH=$PWD python -m bench.simulator.prefill_budget --seeds 0,1,2 \\
        --configs "default= fixed256=mnbt:256 cap256=cap:256" [--json out.json]

A configuration is NAME=SPEC, SPEC a comma-separated list of mnbt:N (max_num_batched_tokens),
mns:N (max_num_seqs), cap:N (max_prefill_tokens_while_decoding), backlog:N
(prefill_backlog_tokens). The engine model is the CUDA engine's: async loop (each step planned while the one before runs, launch deadline on
every graph step; lead 2.06 ms = 2 x the profile's median decode launch + 1 ms), the host's launch
hidden behind the step before (`hide_launch`), the delivery path measured live on the H200 (3.26
ms, issue 18), and the H200's power-cap model (`power_cap`; off with --no-power-cap).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from engine_flags import DEFAULT_CUDA_GRAPH_TOKEN_BUCKETS, int_list
from scheduler.capacity import PrefillCap
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from sims.profile_cost import ProfileCost
from sims.report import summarize
from sims.workload import LengthSpec, WorkloadConfig, generate

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "bench" / "results" / "fidelity_h200_2" / "profile_33b.json"
# today's run (the engine as it is), and the second session's `--max-num-batched-tokens 256` run
# at 8 req/s: the only live steps of bucket 256 with ~25 decodes (409 of them; today's log has
# one), which is the step a 256-token prefill budget makes
DEFAULT_STEP_LOG = ",".join(str(REPO / "bench" / "results" / p) for p in (
    "serving_h200_s4/steps_bf16.jsonl.gz", "serving_h200_async/steps_chunk256.jsonl.gz"))
NUM_KV_BLOCKS = 17069  # the 33B bf16 pool on the H200 (both runs)
ASYNC_PLAN_LEAD_S = 2.06e-3   # bench.simulator.validate.async_plan_lead on that profile (issue 18)
DELIVERY_DELAY_S = 3.26e-3    # HTTP in + out, measured live on the H200 at 0.5x (issue 18)


@dataclass(frozen=True)
class ServingWorkload:
    name: str
    input_len: int
    output_len: int
    num_requests: int
    rate: float  # requests/s; inf: all at once


ISSUE11 = (ServingWorkload("short_2rps", 16, 32, 40, 2.0),
           ServingWorkload("short_burst", 16, 32, 256, math.inf),
           ServingWorkload("long_8rps", 512, 128, 200, 8.0),
           ServingWorkload("long_burst", 512, 128, 400, math.inf))
# The suite as run: `bench serve` draws prompts from (seed, 1) and every workload uses seed 0, so
# the 400-burst's first 200 prompts are long_8rps's 200, still in the backend's prefix cache when
# the burst comes (its step log: 200 chunks start at position 496, 31 of 32 blocks hit). Modelled
# as 16-token prompts (the uncached last block; a chunk's cost hardly depends on its start).
AS_RUN = {"long_burst_asrun": (ServingWorkload("long_burst_asrun", 512, 128, 400, math.inf), 200, 16)}


class StepLogCost:
    """A cost model from live serving step logs (`--step-log`: one JSON line per step with its
    device time, decodes and prefill chunks). Decode-only steps: the median device time per
    decode batch, linearly interpolated between the batches seen. Steps with prefill tokens run
    as the captured graph of the smallest token bucket >= their tokens, whose matrix products
    cost what the bucket's size costs: t = g(bucket) + b*d + f*sum(p_i^2) + h*sum(p_i*s_i) (d
    decodes, chunks of p_i tokens from position s_i), g one value per bucket seen (linear in the
    bucket's tokens between them), fitted by non-negative least squares over every such step
    (rows weighted by 1/sqrt(t): between absolute and relative errors). The live loop's
    conditions come with it (the async loop hides the launch; the power cap at the suite's duty,
    on average): unlike the paused profile it covers the bursts' decode batches of 128-256 (the
    profile stops at 64; its extrapolation charges batch 256 at 53 ms against 29-39 live) and
    runs at the engine's current graph buckets. Context length is not in the log (the profile's
    fit gave it no weight)."""

    accepts_prefill_chunks = True

    def __init__(self, paths: list[str], buckets: list[int], num_blocks: int = NUM_KV_BLOCKS):
        self.buckets = np.array(sorted(buckets), dtype=np.float64)
        self.num_blocks = num_blocks
        self.decode_rows: list[tuple[float, int, float]] = []  # (wall start, decodes, seconds)
        steps, times = [], []
        for path in paths:
            with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as fh:
                for line in fh:
                    r = json.loads(line)
                    ms = r.get("device_ms") or r["ms"]
                    if r["prefill_tokens"]:
                        if "prefill" in r:
                            chunks = [(c[1], c[2]) for c in r["prefill"]]
                        else:  # older logs: chunk count only (equal chunks from position 0)
                            k = max(1, r.get("prefill_chunks", 1))
                            chunks = [(r["prefill_tokens"] / k, 0)] * k
                        steps.append((r["decodes"], chunks))
                        times.append(ms * 1e-3)
                    elif r["decodes"]:
                        self.decode_rows.append((r["t"], r["decodes"], ms * 1e-3))
        self.decode_window(None)
        seen = sorted({self._bucket(d, ch) for d, ch in steps})
        col = {b: i for i, b in enumerate(seen)}
        x = np.zeros((len(steps), len(seen) + 3))
        for row, (d, ch) in zip(x, steps):
            row[col[self._bucket(d, ch)]] = 1.0
            row[-3:] = self._shape(d, ch)
        y = np.array(times)
        w = 1.0 / np.sqrt(y)
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
        coef = nnls(x * w[:, None] / scale, y * w)[0] / scale
        self.bucket_tokens, self.bucket_s = np.array(seen, dtype=np.float64), coef[:len(seen)]
        self.shape_coef = coef[len(seen):]
        pred = x @ coef
        self.r2 = 1.0 - float(((y - pred) ** 2).sum()) / float(((y - y.mean()) ** 2).sum())
        self.num_prefill_steps, self.num_decode_steps = len(y), len(self.decode_rows)
        self.rel_err_p90 = float(np.percentile(np.abs(pred / y - 1.0), 90))
        self._memo: dict[tuple, float] = {}

    def decode_window(self, window: tuple[float, float] | None) -> StepLogCost:
        """Decode-only steps from the steps started inside `window` (wall seconds) only, or from
        all (None). A decode step's time at one batch depends on the power state the load before
        it left (batch 256: 30.3 ms in the 16/32 burst, 39.0 ms in the 512/128 burst's sustained
        phase, SM clock 1,980 -> 1,125 MHz), which this model does not otherwise know."""
        decode: dict[int, list[float]] = {}
        for t, d, sec in self.decode_rows:
            if window is None or window[0] <= t <= window[1]:
                decode.setdefault(d, []).append(sec)
        self.decode_d = np.array(sorted(decode), dtype=np.float64)
        self.decode_t = np.array([np.median(decode[d]) for d in sorted(decode)])
        self._memo = {}
        return self

    def _bucket(self, d: int, chunks) -> int:
        n = d + sum(p for p, _ in chunks)
        i = int(np.searchsorted(self.buckets, n))
        return int(self.buckets[i]) if i < len(self.buckets) else n

    @staticmethod
    def _shape(d: int, chunks) -> tuple[float, float, float]:
        return float(d), float(sum(p * p for p, _ in chunks)), float(sum(p * s for p, s in chunks))

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                  prefill_chunks=None) -> float:
        d = num_decode_seqs
        if not num_prefill_tokens:
            return float(np.interp(d, self.decode_d, self.decode_t)) if d else 0.0
        if prefill_chunks is None:
            chunks = ((num_prefill_tokens, 0),)
        else:
            chunks = tuple((c, 0) if isinstance(c, int) else (c if isinstance(c, tuple)
                           else (len(c.token_ids), c.start_pos)) for c in prefill_chunks)
        key = (d, chunks)
        t = self._memo.get(key)
        if t is None:
            g = float(np.interp(self._bucket(d, chunks), self.bucket_tokens, self.bucket_s))
            t = self._memo[key] = g + float(np.dot(self._shape(d, chunks), self.shape_coef))
        return t

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        return np.full(k, self.step_time(num_decode_seqs, 0, num_context_tokens))

    def num_kv_blocks(self, block_size: int) -> int:
        return self.num_blocks

    def describe(self) -> dict:
        return {"kind": "step_log",
                "bucket_ms": {int(b): round(float(t) * 1e3, 2)
                              for b, t in zip(self.bucket_tokens, self.bucket_s)},
                "per_decode_ms": round(float(self.shape_coef[0]) * 1e3, 4),
                "per_p2_ms": float(self.shape_coef[1]) * 1e3, "per_ps_ms": float(self.shape_coef[2]) * 1e3,
                "prefill_fit_r2": round(self.r2, 4), "prefill_fit_rel_err_p90": round(self.rel_err_p90, 4),
                "num_prefill_steps": self.num_prefill_steps, "num_decode_steps": self.num_decode_steps}


def parse_config(spec: str) -> tuple[str, dict]:
    """NAME=mnbt:N,mns:N,cap:N,backlog:N,seqs:N -> (NAME, SimSchedulerConfig keywords)."""
    name, _, body = spec.partition("=")
    capacity, cap = {}, {}
    for item in filter(None, body.split(",")):
        k, _, v = item.partition(":")
        if k == "mnbt":
            capacity["max_num_batched_tokens"] = int(v)
        elif k == "mns":
            capacity["max_num_seqs"] = int(v)
        elif k in ("cap", "backlog", "seqs"):
            cap[{"cap": "max_tokens", "backlog": "backlog_tokens", "seqs": "backlog_seqs"}[k]] = int(v)
        else:
            raise SystemExit(f"unknown key {k!r} in {spec!r} (mnbt, mns, cap, backlog, seqs)")
    return name, {**capacity, **({"prefill_cap": PrefillCap(**cap)} if cap else {})}


def run_one(cost, w: ServingWorkload, sched_kw: dict, seed: int) -> dict:
    wl = generate(WorkloadConfig(num_requests=w.num_requests,
                                 rate=w.rate if math.isfinite(w.rate) else 1e9,
                                 input_len=LengthSpec("fixed", w.input_len),
                                 output_len=LengthSpec("fixed", w.output_len), seed=seed))
    if w.name in AS_RUN:
        _, num_cached, uncached = AS_RUN[w.name]
        wl.prompt_len[:num_cached] = uncached
    sched = SimSchedulerConfig(max_model_len=16384, enable_prefix_caching=False, **sched_kw)
    engine = EngineConfig(num_backends=1, num_samples=1, delivery_delay_s=DELIVERY_DELAY_S,
                          async_plan_lead_s=ASYNC_PLAN_LEAD_S)
    res = simulate(wl, cost, sched, engine)
    rep = summarize(res)
    st = res.step_time
    pre = res.step_prefill > 0
    return {"ttft_p50": rep["ttft_ms"]["p50"], "itl_p50": rep["itl_ms"]["p50"],
            "itl_p99": rep["itl_ms"]["p99"], "tpot_p50": rep["tpot_ms"]["p50"],
            "tok_s": rep["output_throughput"], "steps": len(st), "prefill_steps": int(pre.sum()),
            "prefill_step_ms_mean": float(st[pre].mean() * 1e3) if pre.any() else 0.0,
            "step_ms_max": float(st.max() * 1e3) if len(st) else 0.0,
            "completed": rep["completed"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", default="log", choices=["log", "profile"],
                    help="log: the live serving step log (default); profile: the paused profile")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--step-log", default=DEFAULT_STEP_LOG,
                    help="comma-separated step logs for --cost log")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--configs", default="default= fixed256=mnbt:256 cap256=cap:256")
    ap.add_argument("--workloads", default=",".join(w.name for w in ISSUE11) + ",long_burst_asrun")
    ap.add_argument("--no-power-cap", action="store_true", help="--cost profile: no power-cap model")
    ap.add_argument("--all-decodes", action="store_true",
                    help="--cost log: decode steps from the whole log, not the workload's own window")
    ap.add_argument("--long-rates", default="",
                    help="also 512/128 x200 at these rates (req/s, comma-separated; decode steps "
                    "from long_8rps's window)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    buckets = int_list(DEFAULT_CUDA_GRAPH_TOKEN_BUCKETS)
    if a.cost == "log":  # the live loop's steps: launch hidden and power cap in the data already
        cost = StepLogCost(a.step_log.split(","), buckets)
        print(cost.describe())
    else:
        cost = ProfileCost.from_json(a.profile, token_buckets=buckets, hide_launch=True,
                                     power_cap=not a.no_power_cap)
    windows: dict[str, tuple[float, float]] = {}
    summary = Path(a.step_log.split(",")[0]).parent / "summary.json"
    if a.cost == "log" and summary.is_file() and not a.all_decodes:
        for row in json.loads(summary.read_text())["rows"]:
            if row["config"] == "bf16":
                windows[row["workload"]] = tuple(row["window_wall_s"])
    seeds = int_list(a.seeds)
    extra = tuple(ServingWorkload(f"long_{r:g}rps", 512, 128, 200, r)
                  for r in (float(x) for x in a.long_rates.split(",") if x.strip()))
    names = a.workloads.split(",") + [w.name for w in extra]
    rows = []
    print("| config | workload | TTFT p50 ms | ITL p50 / p99 ms | p99/p50 | TPOT p50 ms | out tok/s "
          "| steps (prefill) | prefill step mean ms | longest step ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec in a.configs.split():
        name, kw = parse_config(spec)
        for w in ISSUE11 + tuple(v[0] for v in AS_RUN.values()) + extra:
            if w.name not in names:
                continue
            if a.cost == "log":
                base = w.name.removesuffix("_asrun")
                cost.decode_window(windows.get(base, windows.get("long_8rps") if w in extra else None))
            runs = [run_one(cost, w, kw, s) for s in seeds]
            mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            ratio = [r["itl_p99"] / r["itl_p50"] for r in runs]
            rows.append({"config": name, "spec": spec, "workload": w.name, "seeds": seeds,
                         "runs": runs, "mean": mean})
            print(f"| {name} | {w.name} | {mean['ttft_p50']:.1f} | {mean['itl_p50']:.1f} / "
                  f"{mean['itl_p99']:.1f} | {np.mean(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}) "
                  f"| {mean['tpot_p50']:.1f} | {mean['tok_s']:,.0f} | {mean['steps']:.0f} "
                  f"({mean['prefill_steps']:.0f}) | {mean['prefill_step_ms_mean']:.1f} "
                  f"| {mean['step_ms_max']:.1f} |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"cost": a.cost, "step_log": a.step_log,
                                            "profile": a.profile, "token_buckets": buckets,
                                            "power_cap": not a.no_power_cap,
                                            "async_plan_lead_s": ASYNC_PLAN_LEAD_S,
                                            "delivery_delay_s": DELIVERY_DELAY_S, "rows": rows},
                                           indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
