"""Issue 34 in the simulator: prefix pull's goodput, and the disaggregated Slow prefill's tail ITL.

    python -m sims.kv_pull_study pull  --json out/pull.json     # 4 tiny CPU backends (profile)
    python -m sims.kv_pull_study split --json out/split.json    # 33B on the H200 (roofline)

pull: 4 backends with the measured tiny CPU profile (bench/results/kv_pull_cpu), a prefix-heavy
trace (`--tenants` system prompts of `--prefix-len` tokens + a 64-token question, 16 out), swept
over `--rates` with and without prefix pull (same arrivals per seed); goodput = the share of
requests with TTFT <= --slo-ttft-ms and TPOT <= --slo-tpot-ms. Capacity = the no-pull knee
(goodput 90%); then `--load` x capacity, both ways. By default each backend has the profile's
device to itself; `--shared-cores C` puts the four on C cores instead (processor sharing of the
steps in progress, sims.shared_cores: the live CPU run's 4 backends of 1 torch thread on this
box's 2 cores), `--host-cpu-ms` takes the gateway's and the load generator's CPU a request off
those cores, and `--step-host-ms` (or `--step-host-from` a lone backend's step log) adds the
backend's loop time per step that a profile of the runner alone lacks.

split: 512/128 decode-heavy traffic at `--rate` plus Slow 8K-token prompts (128 out) at 0.5
req/s: one mixed backend against a decode backend + a prefill-only backend (the gateway's split
rule, scheduler.kv_cost.should_split, with the link rate given). Reports ITL p50/p99 of all
streams and TTFT of the long prompts (and of the streams). Same scheduler code as live; the
prefill backend is a FIFO server (sims.kv_pull), on a device of its own: two backends sharing one
GPU slow each other's steps, which is not modelled. `--prefill-cap` (the backends' prefill tokens
per step while decoding; a CUDA backend's default is 256, off here unless given),
`--split-min-tokens` / `--split-margin` (the gateway's --kv-split-*), `--modes one|split|both`.
"""
from __future__ import annotations

import argparse
import gzip
import json

import numpy as np

from scheduler.capacity import PrefillCap
from scheduler.kv_cost import KVRates, PullConfig
from scheduler.placement import PlacementConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from sims.report import summarize
from sims.runner import CostSpec
from sims.shared_cores import SharedCores, simulate_shared
from sims.workload import LengthSpec, Workload, WorkloadConfig, generate

PROFILE = "bench/results/kv_pull_cpu/tiny_cpu_profile.json"


def prefix_trace(rate: float, n: int, tenants: int, prefix_len: int, seed: int,
                 output_len: int = 16) -> Workload:
    return generate(WorkloadConfig(num_requests=n, rate=rate, seed=seed,
                                   input_len=LengthSpec("fixed", prefix_len + 64),
                                   output_len=LengthSpec("fixed", output_len),
                                   shared_prefix_fraction=1.0,
                                   shared_prefix_len=prefix_len, num_prefix_groups=tenants))


class Slowed:
    """A cost model whose step times are `factor` x another's, plus `add_s` a non-empty step:
    the measured profile on backends that share their cores (`slowdown_from_step_logs`
    measures the factor live), or a backend's host time per step that a profile of the runner
    alone does not hold (`step_host_from_step_logs` measures it on a backend running alone)."""

    def __init__(self, inner, factor: float, add_s: float = 0.0) -> None:
        self.inner, self.factor, self.add_s = inner, factor, add_s

    def step_time(self, num_decode_seqs, num_prefill_tokens, *a, **kw) -> float:
        t = self.factor * self.inner.step_time(num_decode_seqs, num_prefill_tokens, *a, **kw)
        return t + self.add_s if self.add_s and num_decode_seqs + num_prefill_tokens else t

    def decode_times(self, num_decode_seqs, *a, **kw):
        t = self.factor * self.inner.decode_times(num_decode_seqs, *a, **kw)
        return t + self.add_s if self.add_s and num_decode_seqs else t

    def decode_span(self, num_decode_seqs, num_context_tokens, k):
        return float(np.sum(self.decode_times(num_decode_seqs, num_context_tokens, k))) if k > 0 else 0.0

    def launch_time(self, *a, **kw) -> float:
        return self.factor * self.inner.launch_time(*a, **kw)

    def __getattr__(self, name):
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def _step_log_rows(profile: str, paths: list[str], context: int = 1100) -> list[tuple]:
    """(live s, profile s, decodes, prefill tokens) of every step in `tidegate backend
    --step-log` files. A decode's context is taken as `context` tokens (the log does not keep
    it); a prefill chunk's from its record."""
    cost = CostSpec(model="tiny", profile=profile).build()
    out = []
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as fh:  # JSON lines (backend.server.step_log; no backend import)
            rows = [json.loads(line) for line in fh if line.strip()]
        for r in rows:
            chunks = [(n, start) for _, n, start in r["prefill"]]
            ctx = r["decodes"] * context + sum(n + start for n, start in chunks)
            out.append((r["ms"] / 1e3, cost.step_time(r["decodes"], r["prefill_tokens"], ctx,
                                                      chunks or None),
                        r["decodes"], r["prefill_tokens"]))
    return out


def slowdown_from_step_logs(profile: str, paths: list[str], context: int = 1100) -> float:
    """Live step time over the profile's for the same steps (`tidegate backend --step-log`
    records): how much slower the live backends ran than the profile says."""
    rows = _step_log_rows(profile, paths, context)
    live, model = sum(r[0] for r in rows), sum(r[1] for r in rows)
    return live / model if model else float("nan")


def step_host_from_step_logs(profile: str, paths: list[str], context: int = 1100) -> float:
    """A backend's host time per step beyond the profile's (seconds): the median of live less
    profile over its decode-only steps, from a backend that ran *alone* (no other process
    sharing its core: its steps are solo steps). The profile times the runner alone; a live
    step also holds the loop's scheduling, drafting and output handling."""
    d = [live - model for live, model, dec, pre in _step_log_rows(profile, paths, context)
         if dec and not pre]
    return float(np.median(d)) if d else 0.0


def run_pull(a: argparse.Namespace, rate: float, seed: int, pull: bool) -> dict:
    cost = CostSpec(model="tiny", profile=a.profile).build()
    if a.slowdown != 1.0 or a.step_host_ms:
        cost = Slowed(cost, a.slowdown, a.step_host_ms / 1e3)
    cfg = PullConfig(default_rates=KVRates(bytes_per_token=a.kv_bytes_per_token,
                                           link_bytes_per_s=a.link_gbps * 1e9,
                                           off_loop=a.serve == "thread")) if pull else None
    engine = EngineConfig(num_backends=a.backends, placement=PlacementConfig(policy=a.placement),
                          kv_pull=cfg)
    wl = prefix_trace(rate, a.num_requests, a.tenants, a.prefix_len, seed,
                      getattr(a, "output_len", 16))
    if getattr(a, "shared_cores", 0.0):
        res = simulate_shared(wl, cost, SimSchedulerConfig(), engine, shared_cores(a, rate))
    else:
        res = simulate(wl, cost, SimSchedulerConfig(), engine)
    rep = summarize(res, slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms)
    return {"rate": rate, "seed": seed, "pull": pull, "goodput": rep["goodput_fraction"],
            "throughput": rep["request_throughput"], "ttft_ms": rep["ttft_ms"],
            "tpot_ms": rep["tpot_ms"], "hit_rate": rep["kv"]["prefix_hit_rate"],
            "kv_pull": res.extra.get("kv_pull"), "shared_cores": res.extra.get("shared_cores")}


def shared_cores(a: argparse.Namespace, rate: float) -> SharedCores:
    """The backends' cores (`--shared-cores`), less `--reserved-cores` and the gateway's and
    load generator's CPU at this rate (`--host-cpu-ms` a request)."""
    return SharedCores(cores=a.shared_cores, threads=a.backend_threads,
                       reserved_cores=a.reserved_cores + rate * a.host_cpu_ms / 1e3)


def study_pull(a: argparse.Namespace) -> dict:
    """Goodput against offered rate, without and with pull (same arrivals per seed). Capacity is
    the no-pull knee (the rate where goodput falls to 90%, `sims.placement_study.knee`); the
    headline is goodput at `--load` x that capacity, and the knee with pull."""
    from sims.placement_study import knee
    rates = [float(x) for x in a.rates.split(",")]
    runs = [run_pull(a, r, s, p) for r in rates for s in range(a.seeds) for p in (False, True)]
    mean = {p: [float(np.mean([x["goodput"] for x in runs if x["pull"] == p and x["rate"] == r]))
                for r in rates] for p in (False, True)}
    cap = knee(rates, mean[False])
    out = {"rates": rates, "goodput_off": mean[False], "goodput_on": mean[True],
           "knee_off": cap, "knee_on": knee(rates, mean[True]), "runs": runs}
    for r, g0, g1 in zip(rates, mean[False], mean[True]):
        pulls = [x["kv_pull"]["pulls"] for x in runs if x["pull"] and x["rate"] == r]
        print(f"{r:7.1f} req/s  goodput off {g0:.3f}  on {g1:.3f}  ({np.mean(pulls):.0f} pulls)")
    if cap:
        rate = a.load * cap
        at = [run_pull(a, rate, s, p) for s in range(a.seeds) for p in (False, True)]
        g = {p: float(np.mean([x["goodput"] for x in at if x["pull"] == p])) for p in (False, True)}
        out.update(capacity_req_s=cap, load=a.load, rate=rate, at_load=at,
                   goodput_at_load_off=g[False], goodput_at_load_on=g[True])
        print(f"capacity (no-pull knee at 90% goodput) {cap:.1f} req/s, with pull "
              f"{out['knee_on'] or float('nan'):.1f}; at {a.load:g}x = {rate:.1f} req/s: goodput "
              f"{g[False]:.3f} -> {g[True]:.3f}")
    return out


def mixed_trace(a: argparse.Namespace, seed: int) -> Workload:
    dur = a.num_requests / a.rate
    base = generate(WorkloadConfig(num_requests=a.num_requests, rate=a.rate, seed=seed,
                                   input_len=LengthSpec("fixed", 512),
                                   output_len=LengthSpec("fixed", 128)))
    n_long = max(1, int(dur * a.slow_rate))
    slow = generate(WorkloadConfig(num_requests=n_long, rate=a.slow_rate, seed=seed + 1000,
                                   input_len=LengthSpec("fixed", a.slow_prompt),
                                   output_len=LengthSpec("fixed", 128)))
    order = np.argsort(np.concatenate([base.arrival_time, slow.arrival_time]), kind="stable")

    def cat(x, y):
        return np.concatenate([x, y])[order]
    return Workload(cat(base.arrival_time, slow.arrival_time), cat(base.prompt_len, slow.prompt_len),
                    cat(base.output_len, slow.output_len), cat(base.prefix_group, slow.prefix_group),
                    cat(base.prefix_len, slow.prefix_len), cat(base.queue_class, slow.queue_class),
                    cat(base.priority, slow.priority))


def shared_gpu_run(wl: Workload, cost, sched: SimSchedulerConfig, engine: EngineConfig,
                   k: float):
    """Prefill + decode backends time-sharing one GPU, crudely: while the prefill backend runs a
    prefill, each of the decode backend's steps takes k x its time, and each prefill takes k x
    its time (the decode backend always has work at this load). k = 2: equal time slices; not
    measured (the live call measures it). Every step is simulated one by one (no stretches)."""
    from bisect import bisect_right
    from dataclasses import replace as dc_replace

    from sims.event_loop import EventLoop
    loop = EventLoop(wl, cost, sched, dc_replace(engine, max_stretch_steps=1))
    pulls = loop.pulls
    pulls.cost = Slowed(cost, k)
    starts: list[float] = []
    ends: list[float] = []
    split = pulls._split

    def recorded_split(be, i, now):
        before = list(pulls.prefill_free)
        done = split(be, i, now)
        for b, after in zip(before, pulls.prefill_free):
            if after != b:
                starts.append(max(now, b))
                ends.append(after)
        return done
    pulls._split = recorded_split
    inner = loop.step_time_fn

    def step_time(*args):
        t = loop.clock.now()
        j = bisect_right(starts, t) - 1
        return inner(*args) * (k if j >= 0 and t < ends[j] else 1.0)
    loop.step_time_fn = step_time
    return loop.run()


def study_split(a: argparse.Namespace) -> dict:
    """One mixed backend against prefill + decode. `--prefill-cap` is the backends' prefill cap
    while decoding (`PrefillCap.max_tokens`, a CUDA backend's default 256; 0 off, as this study
    ran before); `--split-min-tokens` the gateway's `--kv-split-min-tokens` (512: the 512/128
    streams, Slow class by their 128 tokens out, go to the prefill backend too); `--modes`
    which of the two runs."""
    cost = CostSpec(model=a.model, gpu="h200").build()
    if a.kv_blocks:  # the live recipe's --num-blocks per backend (its pool, not the GPU's room)
        cost = Slowed(cost, 1.0)
        cost.num_kv_blocks = lambda block_size: a.kv_blocks
    sched = SimSchedulerConfig(enable_prefix_caching=True,
                               prefill_cap=PrefillCap(max_tokens=a.prefill_cap))
    out = {"model": a.model, "rate": a.rate, "slow_rate": a.slow_rate,
           "slow_prompt": a.slow_prompt, "link_gbps": a.link_gbps, "prefill_cap": a.prefill_cap,
           "split_min_tokens": a.split_min_tokens, "runs": []}
    cfg = PullConfig(split_min_tokens=a.split_min_tokens, split_margin=a.split_margin,
                     default_rates=KVRates(link_bytes_per_s=a.link_gbps * 1e9,
                                           copy_bytes_per_s=a.copy_gbps * 1e9))
    modes = (("one backend", EngineConfig(num_backends=1)),
             ("prefill + decode", EngineConfig(num_backends=1, kv_pull=cfg,
                                               num_prefill_backends=1)))
    for mode, engine in modes:
        if a.modes != "both" and (mode == "one backend") != (a.modes == "one"):
            continue
        wl = mixed_trace(a, a.seed)
        if a.shared_gpu > 1 and engine.num_prefill_backends:
            res = shared_gpu_run(wl, cost, sched, engine, a.shared_gpu)
        else:
            res = simulate(wl, cost, sched, engine)
        rep = summarize(res)
        slow = wl.prompt_len >= a.slow_prompt
        all_ttft = (res.first_token_time - wl.arrival_time) * 1e3
        ttft, stream_ttft = all_ttft[slow], all_ttft[~slow]
        row = {"mode": mode, "itl_ms": rep.get("itl_ms"), "tpot_ms": rep["tpot_ms"],
               "slow_ttft_ms": {"p50": float(np.nanpercentile(ttft, 50)),
                                "p99": float(np.nanpercentile(ttft, 99))},
               "stream_ttft_ms": {"p50": float(np.nanpercentile(stream_ttft, 50)),
                                  "p99": float(np.nanpercentile(stream_ttft, 99))},
               "output_throughput": rep["output_throughput"],
               "request_throughput": rep["request_throughput"],
               "kv_pull": res.extra.get("kv_pull")}
        itl = row["itl_ms"] or {}
        row["itl_p99_over_p50"] = itl.get("p99", float("nan")) / max(itl.get("p50", 0), 1e-9)
        out["runs"].append(row)
        print(f"{mode:18} ITL p50 {itl.get('p50', float('nan')):.2f} p99 "
              f"{itl.get('p99', float('nan')):.2f} ms (x{row['itl_p99_over_p50']:.2f}); long "
              f"prompts' TTFT p50 {row['slow_ttft_ms']['p50']:.0f} p99 "
              f"{row['slow_ttft_ms']['p99']:.0f} ms; streams' TTFT p50 "
              f"{row['stream_ttft_ms']['p50']:.0f} p99 {row['stream_ttft_ms']['p99']:.0f} ms; "
              f"{row['output_throughput']:.0f} tok/s; {row['kv_pull'] or ''}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sims.kv_pull_study",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("study", choices=("pull", "split"))
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--link-gbps", type=float, default=1.0,
                    help="pull link rate, GB/s (pull: ZMQ on this machine; split: the GPU path)")
    # pull
    ap.add_argument("--profile", default=PROFILE)
    ap.add_argument("--backends", type=int, default=4)
    ap.add_argument("--placement", default="prefix")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=16,
                    help="tokens out per request (the live run's 16; fewer: the decode steps a "
                         "speculating backend takes for them, which the simulator does not model)")
    ap.add_argument("--kv-bytes-per-token", type=float, default=2048.0,
                    help="tiny fp32: 4 layers x 2 kv heads x 32 x (K, V) x 4 bytes")
    ap.add_argument("--rates", default="40,60,80,100,120,140,160")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=100.0)
    ap.add_argument("--serve", choices=("thread", "loop"), default="thread",
                    help="how backends serve pulls: off their step loop (a KV thread, and a "
                         "receiver that lands a pull before its next step) or between steps")
    ap.add_argument("--slowdown", type=float, default=1.0,
                    help="step times x this (backends sharing cores; see --slowdown-from)")
    ap.add_argument("--slowdown-from", nargs="*", default=None, metavar="STEPLOG",
                    help="measure --slowdown from live backends' --step-log files and use it")
    ap.add_argument("--shared-cores", type=float, default=0.0, metavar="C",
                    help="the backends share C cores (processor sharing of their steps, "
                         "sims.shared_cores; 0: a device each, as before)")
    ap.add_argument("--backend-threads", type=float, default=1.0,
                    help="threads a backend's step runs (tidegate backend --cpu-threads)")
    ap.add_argument("--reserved-cores", type=float, default=0.0,
                    help="cores of --shared-cores that processes outside the simulation take")
    ap.add_argument("--host-cpu-ms", type=float, default=0.0,
                    help="CPU ms a request costs the gateway and the load generator on the "
                         "same cores (reserved: rate x this)")
    ap.add_argument("--step-host-ms", type=float, default=0.0,
                    help="a backend's host time per step beyond the profile's (see "
                         "--step-host-from)")
    ap.add_argument("--step-host-from", nargs="*", default=None, metavar="STEPLOG",
                    help="measure --step-host-ms from the step log of a backend that ran alone")
    # split
    ap.add_argument("--model", default="deepseek-coder-33b")
    ap.add_argument("--rate", type=float, default=4.0, help="512/128 requests a second")
    ap.add_argument("--slow-rate", type=float, default=0.5)
    ap.add_argument("--slow-prompt", type=int, default=8192)
    ap.add_argument("--copy-gbps", type=float, default=0.0)
    ap.add_argument("--split-margin", type=float, default=0.5)
    ap.add_argument("--split-min-tokens", type=int, default=PullConfig.split_min_tokens,
                    help="the gateway's --kv-split-min-tokens (512: the streams split too)")
    ap.add_argument("--prefill-cap", type=int, default=0,
                    help="prefill tokens per step while decoding (PrefillCap; a CUDA backend's "
                         "default is 256; 0: off)")
    ap.add_argument("--modes", choices=("both", "one", "split"), default="both")
    ap.add_argument("--kv-blocks", type=int, default=0,
                    help="KV blocks per backend (0: what fits beside the weights; "
                         "scripts/gpu_kv_pull_run.sh gives each backend 2048)")
    ap.add_argument("--shared-gpu", type=float, default=1.0, metavar="K",
                    help="prefill + decode time-sharing one GPU: while a prefill runs, decode "
                         "steps and that prefill take K x their time (1: separate devices)")
    a = ap.parse_args(argv)
    if a.slowdown_from:
        a.slowdown = slowdown_from_step_logs(a.profile, a.slowdown_from)
        print(f"slowdown {a.slowdown:.2f} (live step time / profile's, "
              f"{len(a.slowdown_from)} step logs)")
    if a.step_host_from:
        a.step_host_ms = 1e3 * step_host_from_step_logs(a.profile, a.step_host_from)
        print(f"step host time {a.step_host_ms:.2f} ms (live decode steps less the profile's, "
              f"{len(a.step_host_from)} step logs)")
    if a.study == "split" and a.num_requests == 2000:
        a = replace_ns(a, num_requests=400)
    out = study_pull(a) if a.study == "pull" else study_split(a)
    out["argv"] = vars(a)
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def replace_ns(a: argparse.Namespace, **kw) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(a), **kw})


if __name__ == "__main__":
    raise SystemExit(main())
