"""`tidegate sim validate`: the simulator against the live gateway + engine (issue 5, section 7).
In bench/ because it drives the live service and the simulator both (sims/ imports neither
the gateway nor bench/).

    tidegate sim validate --profile out/validate_profile.json --seeds 0,1,2 \\
        --loads 0.25,0.8,1.2 --num-requests 120 --input-len 64 --output-len 32 --json validate.json

1. Profile: `tidegate backend profile` (a subprocess, the same engine defaults as the embedded backend)
   over a grid sized for the workload; written to --profile and reused while it exists
   (--reprofile measures again). This is the measured cost model (`sims.profile_cost.ProfileCost`).
2. Live: `tidegate serve` with its embedded backend (a subprocess on a free port), driven by the
   `bench` load generator (`bench.serving.loadgen.run_http`, `sims.metrics.summarize`: what
   `tidegate bench serve` runs) with a Poisson schedule of fixed lengths. One untimed warm-up run first.
3. Sim: the same workload (`sims.workload.generate` with the same seed gives the same arrivals and
   lengths as `sims.workload.make_schedule`) through `sims.event_loop.simulate` + `sims.report.summarize`
   (what `tidegate sim run --profile` does), one backend, the live
   backend's KV blocks / block size / max_model_len (read from its start-up line), the profile's
   max_num_seqs / max_num_batched_tokens (the engine defaults it ran with), and the batcher and queue
   configuration the gateway builds from the same `serve` flags (`gateway.serve.gateway_config`).
4. Loads: --rates, or --loads as fractions of the profile's capacity estimate (`capacity_estimate`).
   Every (load, seed) pair runs live then simulated; per load the table shows mean ± t·s/√n over the
   seeds (95% by default) of the live value, the simulated value and the relative error
   (sim − live) / live, for P50/P99 TTFT, P50/P99 TPOT, output throughput — and ITL P50, the live
   per-step time seen by the client, as a diagnostic of the cost model itself.
5. Replay (`summary_replay`, third table; issue 18): the gateway runs with `--decision-log`; each
   run's recorded arrivals (the pushes into the batcher, with the exact prompt and max_tokens)
   are simulated again (`sims.decision_replay`), so the load generator's send jitter and the
   front end's time are out of the comparison, and the gateway's flushed windows are compared
   with the simulator's (`bench.simulator.decision_fidelity.compare`: the share of windows with the same
   membership; idle flush makes it depend on step times, so it is a distance, not an identity).
6. Diagnostic (`summary_scaled`, second table): each simulation again with the profile's step times
   multiplied by live ITL P50 / simulated ITL P50 of that run. This feeds one live number back, so it
   is not a validation; it separates the error of the cost model's level (profile measured alone,
   live backend sharing the cores) from the rest (gateway, batching, IPC, step composition).

The machine's load average is recorded before each live run: on a shared CPU the live step time
follows it, and the profile only knows the load at the time it was measured.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Self

import numpy as np

from bench.simulator.fidelity_stats import (
    GOAL,
    METRICS,
    compare,
    mean_ci,
    summarize_load,
)
from bench.simulator.live_config import live_prefill_cap
from sims.profile_terms import has_pause_check, has_sustained_mixed

REPO_ROOT = Path(__file__).resolve().parents[2]
_READY = re.compile(r"tidegate serving model (\S+) on (http://\S+)")
_BACKEND = re.compile(r"(\d+) KV blocks of (\d+), max_model_len (\d+)")


# ---- lengths --------------------------------------------------------------------------------------
def length_spec(text: str | int):
    """A --input-len / --output-len value ('512', 'uniform:LO:HI', 'lognormal:MEDIAN:SIGMA'), its
    draws capped at 4x its typical length (a lognormal's tail past the model's length would be
    refused live; the profile grid reaches 4x too)."""
    from sims.workload import LengthSpec
    spec = LengthSpec.parse(text)
    return replace(spec, max_len=4 * typical_len(spec)) if spec.kind != "fixed" else spec


def typical_len(spec) -> int:
    """The length the profile grid and the capacity estimate are sized for: the value, the
    uniform's middle, the lognormal's mean."""
    from sims.workload import LengthSpec
    if not isinstance(spec, LengthSpec):
        spec = LengthSpec.parse(spec)
    if spec.kind == "uniform":
        return (spec.low + spec.high) // 2
    if spec.kind == "lognormal":
        return max(1, round(spec.value * math.exp(spec.sigma ** 2 / 2)))
    return int(spec.value)


# ---- 1. profile -----------------------------------------------------------------------------------
def length_quantile(spec, q: float) -> int:
    """The q-quantile of a --input-len / --output-len spec's draws (a fixed length: itself), within
    [1, its max_len] as `length_spec` caps the draws."""
    from statistics import NormalDist

    from sims.workload import LengthSpec
    if not isinstance(spec, LengthSpec):
        spec = length_spec(spec)
    if spec.kind == "uniform":
        x = spec.low + q * (spec.high - spec.low)
    elif spec.kind == "lognormal":
        x = spec.value * math.exp(spec.sigma * NormalDist().inv_cdf(q))
    else:
        x = typical_len(spec)
    return int(min(max(1, round(x)), spec.max_len))


# The quantiles of the lengths the grid's decode contexts span for lengths drawn from a distribution
# (`grid_context_lens`): the decodes' contexts run from a short prompt's to a long prompt's plus a
# long output's.
GRID_CONTEXT_QUANTILES = (0.1, 0.9)


def grid_context_lens(input_len, output_len) -> list[int] | None:
    """The profile grid's decode contexts for lengths drawn from a distribution (issue 35, session
    20), in the profiler's order: the typical prompt first (the context the spread points and the
    verifies are built on, as before), then a short prompt's (the 10th percentile) and a long
    prompt's plus a long output's (the 90th percentiles of each). None for fixed lengths: the grid's
    own contexts (prompt to prompt + output) cover every step there.

    Why: with prompt + output / 2 and prompt + output beside the typical prompt (705, 787, 869 for
    prompts lognormal median 512 sigma 0.8, outputs median 128 sigma 0.7) the decode points' total
    context moved with their batch alone, and the fit's context term was not identified: on the
    H200's mixed-lengths parts (session 20) the live decode steps of one sequence ran 0.131 ms per
    1,000 context tokens on the 6.7B against the model's 0.094, and at every batch the model / live
    fell with the context a sequence (6.7B, 9-32 decodes: 1.012 at 401-600 tokens, 0.990 at
    601-800, 0.961 at 801-1,000, 0.943 at 1,001-1,400; the 33B likewise) where live contexts ran from
    ~200 to ~3,400 tokens."""
    ins, outs = length_spec(input_len), length_spec(output_len)
    if ins.kind == "fixed" and outs.kind == "fixed":
        return None
    lo, hi = GRID_CONTEXT_QUANTILES
    typical = typical_len(ins)
    short = length_quantile(ins, lo)
    long = length_quantile(ins, hi) + length_quantile(outs, hi)
    return list(dict.fromkeys([typical, short, long]))


def profile_grid(input_len: int, output_len: int, max_num_seqs: int = 256,
                 prefill_cap_tokens: int | None = None,
                 context_lens: list[int] | None = None) -> dict[str, str]:
    """A grid covering the workload: decode batches up to 128 (capped by max_num_seqs), prefills of
    1-4 prompts (as one chunk, the profile's shape), contexts from the prompt to prompt + output
    (`context_lens`: these instead, in this order; `grid_context_lens` for drawn lengths).

    Decode batches past 64 (issue 35, session 17): the live runs at 0.95-1.2x reached 125-132
    sequences on the 6.7B and 98-100 on the 33B, which a grid up to 64 left to extrapolation: past
    the last measured graph bucket a step's cost jumps by what the model and format make of the
    next one (64 -> 65 decodes: +0.0 ms on the 6.7B FP8, +0.3 bf16, +1.3 on the 33B bf16; a 256-token
    chunk beside 65-128 decodes runs the 384-token graph, live as cheap as the 320-token one on the
    6.7B FP8, 1.4 ms dearer in bf16), so the model charged the 6.7B FP8's 0.95x mixed steps of
    that shape 6% over and its decode steps of 97-128 sequences 10-16% over, the 33B bf16's of
    65-86 5-7% under. The loads' rates stay those of the best batch up to 64
    (`--capacity-max-batch`).

    `prefill_cap_tokens` (the live engine's cap while sequences decode, `live_prefill_cap`; a CUDA
    backend's default is 256): the engine runs a prompt longer than the cap as cap-sized chunks
    beside the decodes, the later ones from a cached prefix, so the grid measures those steps too:
    chunks of the cap and of a quarter of it (a small chunk: the mixed step's own constant and the
    compute knee, `ProfileCost`) at every decode batch and context, and chunks starting at position
    cap (`prefill_context_lens`; with drawn lengths, `context_lens` given, also at 4 and 8 x the cap:
    PREFIX_START_MULTIPLES). Without them the cost model interpolated a 256-token chunk beside
    d decodes between the decode-only step and a 512-token chunk: on the H200's 6.7B preset those
    steps (with the 512-token ones 53-56% of the busy time) were charged 0.84-0.90 of their live time and the
    simulation ran TTFT P50 36% and TPOT P50 26% fast (issue 35, 2026-12-04 night)."""
    d = [x for x in (0, 1, 2, 4, 8, 16, 32, 64, 128) if x <= max_num_seqs]
    p = {0, input_len, 2 * input_len, 4 * input_len}
    s: list[int] = []
    cap = int(prefill_cap_tokens or 0)
    if 0 < cap < input_len:
        p |= {cap, max(1, cap // 4)}
        s = [cap]
        if context_lens:  # drawn lengths: chunks from far into long prompts too (PREFIX_START_MULTIPLES)
            s += [m * cap for m in PREFIX_START_MULTIPLES]
    c = (list(context_lens) if context_lens
         else sorted({input_len, input_len + output_len // 2, input_len + output_len}))
    return {"decode_batch_sizes": ",".join(map(str, d)), "prefill_tokens": ",".join(map(str, sorted(p))),
            "context_lens": ",".join(map(str, c)), "prefill_context_lens": ",".join(map(str, s))}


# drawn lengths (issue 35, session 28): cached-prefix points also at these multiples of the cap (1,024 and
# 2,048 with the CUDA cap of 256). Why: a long drawn prompt runs as cap-sized chunks from ever later
# starts (lognormal median 512 sigma 0.8: 12% of the H200 6.7B part's mixed chunks from >= 1,024, to
# ~3,000), where one measured start (the cap) left the prefix's cost a line through it; on the H100
# the increment at 1,024-2,048 is 1.1-1.8 x that line (bench/results/fidelity_prefix_s26), and the live
# chunks from >= 1,024 were still charged 0.955-0.957 of live (H200 6.7B / 33B). With points at several
# starts the cost model keeps the fitted prefix form, whose s axis they support (sims.profile_cost,
# "The prefix term from twins"). ~16 more points: ~+15 s on the 6.7B, ~+35 s on the 33B bf16
PREFIX_START_MULTIPLES = (4, 8)

CUDA_PROFILE_PAUSE_MS = 60.0  # the H200 pause check: 52.4 ms paused vs 57.9 back to back (issue 18)


def profile_pause_ms(a: argparse.Namespace) -> float:
    if a.profile_pause_ms is not None:
        return a.profile_pause_ms
    return CUDA_PROFILE_PAUSE_MS if str(a.device).startswith("cuda") else 0.0


def ensure_profile(a: argparse.Namespace) -> tuple[Path, bool]:
    """The profile JSON at a.profile, measuring it first unless it exists (and not --reprofile)."""
    path = Path(a.profile)
    if path.is_file() and not a.reprofile:
        doc = json.loads(path.read_text())
        for key, want in (("model", a.model), ("device", a.device)):
            if str(doc.get(key)) != str(want):
                raise ValueError(f"{path}: profiled {key} {doc.get(key)!r}, not {want!r}; "
                                 f"use --reprofile or another --profile path")
        return path, False
    cap = live_prefill_cap(a.device, a.engine_arg)
    grid = profile_grid(typical_len(a.input_len), typical_len(a.output_len),
                        prefill_cap_tokens=cap.max_tokens if cap is not None else None,
                        context_lens=grid_context_lens(a.input_len, a.output_len))
    cmd = [sys.executable, "-m", "gateway.tidegate_cli", "backend", "profile", "--model", a.model,
           "--device", a.device, "--out", str(path), "--repeats", str(a.profile_repeats),
           "--warmup", str(a.profile_warmup), "--pause-ms", str(profile_pause_ms(a)),
           "--device-time", getattr(a, "profile_device_time", "on"),
           "--decode-batch-sizes", a.decode_batch_sizes or grid["decode_batch_sizes"],
           "--prefill-tokens", a.prefill_tokens or grid["prefill_tokens"],
           "--context-lens", a.context_lens or grid["context_lens"],
           # with an explicit --prefill-tokens grid, no cached-prefix points unless the cap's
           "--prefill-context-lens", grid["prefill_context_lens"] if not a.prefill_tokens else "",
           *a.engine_arg]
    path.parent.mkdir(parents=True, exist_ok=True)
    _log(a, f"profiling: {' '.join(cmd[1:])}")
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"backend profile failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return path, True


def ensure_checked_profile(a: argparse.Namespace) -> tuple[Path, bool, dict | None]:
    """`ensure_profile`, then with a cached profile and `--profile-check` its check: (path, measured
    now, the check's result or None). With `reprofile`, a cached profile outside the tolerance, or one
    whose check could not run, is measured again at its path."""
    profile, measured = ensure_profile(a)
    if measured or getattr(a, "profile_check", "off") == "off":
        return profile, measured, None
    try:
        check = check_cached_profile(a, profile)
    except (RuntimeError, ValueError) as e:  # a check that cannot run must not cost the part its runs
        _log(a, f"profile check failed: {e}")
        check = {"error": str(e), "within": False}
    if not check["within"] and a.profile_check == "reprofile":
        _log(a, "the cached profile is another card's: measuring this card's")
        profile, measured = ensure_profile(argparse.Namespace(**{**vars(a), "reprofile": True}))
    return profile, measured, check


def check_cached_profile(a: argparse.Namespace, path: Path) -> dict:
    """`--profile-check`: a few of the cached profile's points measured again on this device
    (bench.simulator.profile_check), logged and returned."""
    from bench.simulator import profile_check

    tol = getattr(a, "profile_check_tolerance", None)
    result = profile_check.run_check(path, a.model, a.device, a.profile_repeats, a.profile_warmup,
                                     list(a.engine_arg), profile_check.DEFAULT_TOLERANCE_PCT if tol is None else tol,
                                     cwd=REPO_ROOT)
    _log(a, f"{profile_check.describe(result)} ({result['seconds']:.0f} s)")
    return result


def capacity_estimate(cost, input_len: int, output_len: int, max_num_seqs: int,
                      max_batch: int) -> dict:
    """Requests/s one backend sustains by the profile: for decode batch B, a request costs its
    prefill step alone plus its share of (output_len - 1) decode steps at batch B with the mean
    context (prompt + half the output); the best B up to the profiled maximum wins."""
    t_pf = cost.step_time(0, input_len, input_len)
    best = {"request_rate": 0.0}
    ctx = input_len + output_len // 2
    for b in range(1, min(max_num_seqs, max_batch) + 1):
        t_dec = cost.step_time(b, 0, b * ctx)
        per_req = t_pf + (output_len - 1) * t_dec / b
        rate = 1.0 / per_req
        if rate > best["request_rate"]:
            best = {"request_rate": rate, "decode_batch": b, "decode_step_ms": t_dec * 1e3,
                    "prefill_step_ms": t_pf * 1e3, "output_throughput": rate * output_len}
    return best


def capacity_batch_limit(profile_doc: dict, capacity_max_batch: int | None = 64) -> int:
    """The largest decode batch `capacity_estimate` tries: the profile's largest, and at most
    `capacity_max_batch` (64 by default: the grid's largest before issue 35's session 17 measured
    to 128 for the steps the live runs reach, so the loads' rates stay as before; 0 or None: the
    profile's largest)."""
    top = max(int(pt["num_decode_seqs"]) for pt in profile_doc["points"])
    return max(1, min(top, int(capacity_max_batch)) if capacity_max_batch else top)


# ---- 2. the live service --------------------------------------------------------------------------
@dataclass
class LiveServer:
    """`tidegate serve` (embedded backend) as a child process group; stdout read by a thread."""
    argv: list[str]
    startup_timeout: float = 180.0
    lines: list[str] = field(default_factory=list)
    url: str = ""
    model: str = ""
    num_blocks: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    backend_line: str = ""  # the backend's ready line (its KV pool, and what quantizing gave back)

    def __enter__(self) -> Self:
        cmd = [sys.executable, "-m", "gateway.tidegate_cli", "serve", *self.argv]
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                m = _BACKEND.search(line)
                if m and self.num_blocks is None:
                    self.num_blocks, self.block_size, self.max_model_len = map(int, m.groups())
                    self.backend_line = line.strip()
                m = _READY.search(line)
                if m:
                    self.model, self.url = m.group(1), m.group(2)
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(self.startup_timeout) or not self.url:
            self.__exit__(None, None, None)
            tail = "\n".join(self.lines[-10:])
            raise RuntimeError(f"tidegate serve did not start:\n{tail}")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)      # serve stops its embedded backend
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)   # our own group: serve + its backend
                self.proc.wait()
        self._reader.join(5)  # its output read to the end, then the pipe closed
        if not self._reader.is_alive():
            self.proc.stdout.close()


def prompt_seed(seed: int, load_index: int) -> int:
    """The prompts' seed of one (seed, load) run: a different one per run (and never the warm-up's
    0). One live backend serves every run and keeps earlier prompts in its prefix cache; with one
    prompt seed per seed, a seed's second load found 496 of each 512-token prompt cached (issue 18:
    17-18 prefill tokens per prefill step in the H200 step log) and measured that, not the load."""
    return (seed + 1) * 1000 + load_index


def run_live(url: str, model: str, n: int, rate: float, input_len, output_len, seed: int,
             timeout_s: float = 600.0, burstiness: float = 1.0, prompts_seed: int | None = None,
             records_out: list | None = None) -> dict:
    """One bench run (the same calls as `tidegate bench serve`); returns bench's summary. The
    schedule comes from `seed`, the prompts' token ids from `prompts_seed` (default `seed`)."""
    from bench.serving import loadgen
    from sims.metrics import summarize
    from sims.workload import LengthSpec, ScheduleConfig, make_prompts, make_schedule

    def spec(x):
        return x if isinstance(x, LengthSpec) else LengthSpec.parse(x)

    sched = make_schedule(ScheduleConfig(num_requests=n, rate=rate, input_len=spec(input_len),
                                         output_len=spec(output_len), seed=seed,
                                         burstiness=burstiness))
    prompts = make_prompts(sched, seed if prompts_seed is None else prompts_seed, (0, 256))
    target = loadgen.HttpTarget(url, model=model, timeout_s=timeout_s)
    records, t0, _ = asyncio.run(loadgen.run_http(target, sched.offset, prompts, sched.output_len))
    if records_out is not None:
        records_out.extend(records)
    return summarize(records, start_time=t0)


# ---- 3. the simulator -----------------------------------------------------------------------------
def sim_spec(profile: Path, num_blocks: int, block_size: int, max_model_len: int, max_num_seqs: int,
             max_num_batched_tokens: int, batcher, queue, n: int, rate: float, input_len,
             output_len, seed: int, burstiness: float = 1.0, async_plan_lead_s: float | None = None,
             prefill_cap=None, cost_terms: dict | None = None):
    """`cost_terms`: CostSpec's model terms (`hide_launch`, `power_cap`; `model_terms`)."""
    from scheduler.capacity import PrefillCap
    from sims.adapters import SimSchedulerConfig
    from sims.event_loop import EngineConfig
    from sims.runner import CostSpec, RunSpec
    from sims.workload import LengthSpec, WorkloadConfig

    def _spec(x):
        return x if isinstance(x, LengthSpec) else LengthSpec("fixed", int(x))

    return RunSpec(
        cost=CostSpec(model="tiny", profile=str(profile), num_blocks=num_blocks, **(cost_terms or {})),
        # burstiness K: gamma inter-arrivals of shape K (cv 1/sqrt(K)), as the live schedule's
        workload=WorkloadConfig(num_requests=n, rate=rate,
                                arrival="poisson" if burstiness == 1.0 else "gamma",
                                cv=1.0 / math.sqrt(burstiness),
                                input_len=_spec(input_len), output_len=_spec(output_len),
                                seed=seed),
        scheduler=SimSchedulerConfig(batcher=batcher, queue=queue, max_num_seqs=max_num_seqs,
                                     max_num_batched_tokens=max_num_batched_tokens,
                                     block_size=block_size, max_model_len=max_model_len,
                                     enable_prefix_caching=True,  # as the live engine
                                     prefill_cap=prefill_cap or PrefillCap()),
        engine=EngineConfig(num_backends=1, async_plan_lead_s=async_plan_lead_s))


def model_terms(profile_doc: dict, plan_lead: float | None, hide_launch: str = "auto",
                power_cap: str = "auto", cap_by_power: str = "auto") -> dict:
    """The profile cost model's terms for this engine (issue 35), each "auto" | "on" | "off".
    auto: `hide_launch` with the async loop (its launch runs behind the step before: the
    profile's decode steps were 2.8% over the live ones by that launch, 0.3% under without it, in
    every batch-size and context bin of the 2026-12-03 H200 run); `power_cap` where the profile
    has its pause check (measured with --pause-ms: its points are of a GPU idle before them,
    live prefill steps are not); `cap_by_power` (with the power cap) where the pause check has the
    mixed step's sustained run ("sustained_mixed"), since session 25: on every grid part whose
    profile has it (33B bf16 / FP8 / int4-fp8 KV, 6.7B mixed lengths: 18 runs on the H200) it
    brought more cells inside the bound than the model without it, and never fewer
    (bench/results/fidelity_grid_h200_s25, "The power-by-kind weights by default")."""
    def pick(v: str, auto: bool) -> bool:
        return auto if v == "auto" else v == "on"

    terms = {"hide_launch": pick(hide_launch, plan_lead is not None),
             "power_cap": pick(power_cap, has_pause_check(profile_doc))}
    # `cap_by_power` (issue 35 session 16, the default since session 25: sims.profile_cost "Power by
    # step kind"): named only when on, so that the terms recorded without it read as they did
    if terms["power_cap"] and pick(cap_by_power, has_sustained_mixed(profile_doc)):
        terms["cap_by_power"] = True
    # the partial attention tiles at the fractions the profile's tile-edge pairs measure (the
    # default since session 35, sims.profile_cost "Whole tiles beside a chunk"): named only where a
    # CUDA profile has them (elsewhere "measured" charges nothing), so that older terms read as they did
    from sims.profile_cost import charges_tile_pairs
    if charges_tile_pairs(profile_doc):
        terms["mixed_tiles"] = terms["decode_tiles"] = "measured"
    return terms


def async_plan_lead(profile_doc: dict, device: str) -> float | None:
    """`EngineConfig.async_plan_lead_s` for the live engine: None on the CPU (its loop is
    synchronous: `Engine.overlaps_device`); on CUDA the launch deadline's lead before a decode
    step's end, twice the host's launch time + `backend.engine.continuous.LAUNCH_SLACK_S`, the launch time
    being the profile's median `launch_ms_median` over its decode-only points (0.5 ms, about what
    the H200 measured, for profiles from before that was recorded)."""
    if not str(device).startswith("cuda"):
        return None
    from backend.engine.continuous import LAUNCH_SLACK_S

    launch = [pt["launch_ms_median"] for pt in profile_doc.get("points", [])
              if not pt.get("num_prefill_tokens") and "launch_ms_median" in pt]
    launch_s = float(np.median(launch)) / 1e3 if launch else 0.0005
    return 2 * launch_s + LAUNCH_SLACK_S


def profile_plan_leads(profile_doc: dict, path: str | None = None) -> dict:
    """`--plan-lead profile-kinds` (issue 35): the async loop's two plan leads as the profile
    recorded them (`plan_lead_ms`: decode_only / with_prefill, written by `tidegate backend profile`
    since 2026-12-05, `sims.profile_cost.plan_leads`), in the shape of
    `bench.simulator.plan_lead.plan_leads` ("decode" / "prefill", "median_ms"). ValueError naming
    the profile when it lacks them (a profile from before: re-profile, or `--plan-lead live`)."""
    pl = profile_doc.get("plan_lead_ms") or {}
    if not isinstance(pl, dict) or any(pl.get(k) is None for k in ("decode_only", "with_prefill")):
        raise ValueError(f"--plan-lead profile-kinds: the profile {path or ''} has no plan_lead_ms "
                         "{decode_only, with_prefill} (profiles from before 2026-12-05: re-run "
                         "`tidegate backend profile`, or use --plan-lead profile | live)")
    return {k: {"median_ms": float(pl[src]), "source": "profile plan_lead_ms"}
            for k, src in (("decode", "decode_only"), ("prefill", "with_prefill"))}


class ScaledCost:
    """A cost model with every step time multiplied by `factor` (the diagnostic re-run below)."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, float(factor)
        self.accepts_prefill_chunks = getattr(inner, "accepts_prefill_chunks", False)

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                  prefill_chunks=None) -> float:
        args = (num_decode_seqs, num_prefill_tokens, num_context_tokens)
        if prefill_chunks is not None:
            return self.factor * self.inner.step_time(*args, prefill_chunks=prefill_chunks)
        return self.factor * self.inner.step_time(*args)

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        return self.factor * self.inner.decode_times(num_decode_seqs, num_context_tokens, k)

    def num_kv_blocks(self, block_size: int) -> int:
        return self.inner.num_kv_blocks(block_size)

    def __getattr__(self, name):
        # the rest of the inner model's terms (hides_launch, launch_time, the power cap): the
        # scaled re-run keeps them, as the unscaled one has them
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def run_sim(spec, scale: float = 1.0) -> dict:
    """`sims.runner.run_spec`, optionally with the cost model's step times scaled by `scale`."""
    from sims.event_loop import simulate
    from sims.report import summarize
    from sims.workload import generate

    cost = spec.cost.build()
    if scale != 1.0:
        cost = ScaledCost(cost, scale)
    return summarize(simulate(generate(spec.workload), cost, spec.scheduler, spec.engine))


def read_decisions(path: Path, offset: int):
    """The decision-log records appended at `path` after byte `offset` (one live run's)."""
    from scheduler.decisions import parse_records
    with open(path, encoding="utf-8") as fh:
        fh.seek(offset)
        return parse_records(fh)


def run_replay(spec, arrivals) -> tuple[dict, list, list]:
    """The recorded arrivals through the simulator (same cost model, scheduler, engine):
    its summary, its flushed windows and its steps (StepRecords with the live ids)."""
    from sims.decision_replay import replay_run, step_records
    from sims.report import summarize

    result, batches = replay_run(arrivals, spec.scheduler, spec.cost.build(), spec.engine,
                                 record_steps=True)
    return summarize(result), batches, step_records(result, arrivals)


def prefill_steps_of(steps, ids: set) -> list:
    """The steps that prefill any of `ids` (one run's requests; runs do not overlap in time)."""
    return [s for s in steps if s.prefill and any(c[0] in ids for c in s.prefill)]


def steps_summary(runs: list[dict], confidence: float) -> dict:
    """Per load: how alike the live and simulated prefill steps were (bench.simulator.decision_fidelity
    .compare_steps over each run's prefill steps)."""
    have = [r["steps"] for r in runs if r.get("steps")]
    if not have:
        return {}
    return {"same_prefill_step_share": mean_ci([s["same_prefill_step_share"] for s in have], confidence),
            "requests_chunked_alike": mean_ci([s["requests_chunked_alike"] for s in have], confidence),
            "num_prefill_steps": [sum(s["num_prefill_steps"][i] for s in have) for i in (0, 1)],
            "preemptions": [sum(s["preemptions"][i] for s in have) for i in (0, 1)]}


def _mean_parts(parts: list[dict | None]) -> dict:
    """Per load: the runs' median TTFT parts (bench.serving.ttft_path), averaged over the runs."""
    have = [p for p in parts if p and p.get("num_requests")]
    if not have:
        return {}
    return {k: float(np.mean([p[k] for p in have])) for k in have[0] if k != "mismatched"} | {
        "mismatched": sum(p["mismatched"] for p in have)}


def decisions_summary(runs: list[dict], confidence: float) -> dict:
    """Per load: the same-membership share, mean ± CI over the runs and pooled over all windows."""
    shares = [r["decisions"]["same_membership_share"] for r in runs]
    denom = [max(r["decisions"]["num_batches"]) for r in runs]
    return {"same_membership_share": mean_ci(shares, confidence),
            "same_membership_pooled": (sum(s * d for s, d in zip(shares, denom, strict=True))
                                       / sum(denom)) if sum(denom) else math.nan,
            "num_batches_live": sum(r["decisions"]["num_batches"][0] for r in runs),
            "requests_regrouped": sum(r["decisions"]["requests_regrouped"] for r in runs),
            "frontend_ms_mean": float(np.mean([r["frontend_ms"]["mean"] for r in runs]))}


# ---- 4. statistics: bench.simulator.fidelity_stats ------------------------------------------


def format_table(result: dict, which: str = "summary") -> str:
    def pm(s: dict, fmt: str) -> str:
        ci = "" if not np.isfinite(s["ci"]) else f" ±{s['ci']:{fmt}}"
        return f"{s['mean']:{fmt}}{ci}"

    conf = round(100 * result["config"]["confidence"])
    header = (f"{'load':>6}{'rate/s':>8}  {'metric':<11}{'live':>20}{'sim':>20}"
              f"{'rel err (' + str(conf) + '% CI)':>22}  goal")
    lines = [header]
    for ld in result["loads"]:
        for i, (name, _, _) in enumerate(METRICS):
            s = ld[which][name]
            unit = " tok/s" if name == "throughput" else " ms"
            fmt = ".1f" if name == "throughput" else ".2f"
            err = s["rel_err"]
            ci = "" if not np.isfinite(err["ci"]) else f" ±{100 * err['ci']:.1f}"
            mark = "yes" if s["within_goal"] else "no"
            if name == "itl_p50":
                mark = "(diag)"
            lines.append(f"{(ld['load_label'] if i == 0 else ''):>6}"
                         f"{(format(ld['rate'], '.2f') if i == 0 else ''):>8}  {name:<11}"
                         f"{pm(s['live'], fmt) + unit:>20}{pm(s['sim'], fmt) + unit:>20}"
                         f"{format(100 * err['mean'], '+.1f') + '%' + ci:>22}  {mark}")
    return "\n".join(lines)


# ---- the command ----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate sim validate",
                                description="simulator vs the live gateway + engine (CPU, tiny model)")
    p.add_argument("--profile", default="out/validate_profile.json",
                   help="profile JSON: measured here first unless it exists")
    p.add_argument("--reprofile", action="store_true", help="measure the profile even if it exists")
    p.add_argument("--profile-check", choices=("off", "warn", "reprofile"), default="off",
                   help="with a cached --profile: first re-measure ~30 of its points on this device "
                        "(bench.simulator.profile_check: cards of one kind differ, two H100s by ~3 %% in "
                        "decode) and compare; outside the tolerance, warn: record it and go on, "
                        "reprofile: measure a whole profile (over the cached one); off (default): "
                        "trust the cached profile")
    p.add_argument("--profile-check-tolerance", type=float, default=None, metavar="PCT",
                   help="--profile-check's bound on each kind's median ratio, in %% (default "
                        "profile_check.DEFAULT_TOLERANCE_PCT, 1.5)")
    p.add_argument("--model", default="tiny", help="preset or HF directory (live and profile)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--profile-repeats", type=int, default=5)
    p.add_argument("--profile-warmup", type=int, default=2)
    p.add_argument("--profile-pause-ms", type=float, default=None,
                   help="`backend profile --pause-ms`: idle before each timed prefill step (default "
                        f"{CUDA_PROFILE_PAUSE_MS:g} on CUDA, where back-to-back compute-bound steps "
                        "ran power-capped, ~11%% slower than the serving loop runs them; 0 on the CPU)")
    p.add_argument("--profile-device-time", choices=("on", "off"), default="on",
                   help="`backend profile --device-time`: time each point again queued behind a "
                        "spin, as the serving loop runs it (CUDA only; ~+3 repetitions a point: "
                        "off saves that time in a tight device call, and the cost model then uses "
                        "step minus launch as before session 17)")
    p.add_argument("--decode-batch-sizes", help="profile grid (default: sized for the workload)")
    p.add_argument("--capacity-max-batch", type=int, default=64,
                   help="the capacity estimate (the loads' unit) takes the best decode batch up to "
                        "this and the profile's largest (64: the grid's largest up to issue 35's "
                        "session 17, which measures to 128 for the steps the live runs reach; 0: "
                        "the profile's largest)")
    p.add_argument("--prefill-tokens", help="profile grid")
    p.add_argument("--context-lens", help="profile grid")
    p.add_argument("--num-requests", type=int, default=120, help="per (load, seed) run")
    p.add_argument("--input-len", default="64",
                   help="N | uniform:LO:HI | lognormal:MEDIAN:SIGMA (draws capped at 4x the typical)")
    p.add_argument("--output-len", default="32", help="as --input-len; sent as max_tokens")
    p.add_argument("--loads", default="0.25,0.8,1.2",
                   help="arrival rates as fractions of the profile's capacity estimate")
    p.add_argument("--rates", help="absolute arrival rates (req/s) instead of --loads")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of inter-arrivals, live and simulated (1: Poisson, <1 burstier)")
    p.add_argument("--decision-log", metavar="PATH",
                   help="the gateway's decision log (default: a temporary file); replayed per run")
    p.add_argument("--step-log", metavar="PATH",
                   help="the backend's step log (default: steps.jsonl beside the decision log); "
                        "each run's prefill steps are compared with the replay's")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--warmup-requests", type=int, default=20, help="untimed live run first (0: none)")
    p.add_argument("--settle-s", type=float, default=1.0, help="pause between live runs")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra `tidegate serve` flag (repeat; e.g. --serve-arg=--min-latency-ms=2): "
                        "batcher flags reach the simulator too, through gateway_config")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="engine flag for the profile and the live backend both (repeat; e.g. "
                        "--engine-arg=--quantization=fp8); a cached --profile is not checked "
                        "against these: use --reprofile when they change")
    p.add_argument("--hide-launch", choices=("auto", "on", "off"), default="auto",
                   help="charge the profile's steps without the host's launch (auto: with the async "
                        "loop, i.e. on CUDA; `model_terms`)")
    p.add_argument("--power-cap", choices=("auto", "on", "off"), default="auto",
                   help="the profile's power-cap model for prefill steps (auto: when the profile "
                        "has its pause check; `model_terms`)")
    p.add_argument("--cap-by-power", choices=("auto", "on", "off"), default="auto",
                   help="with the power cap: each prefill step weighs in the busy share by its kind's "
                        "power, from the pause check's capped mixed step run (auto: where the profile "
                        "has that run; sims.profile_cost, \"Power by step kind\"; `model_terms`)")
    p.add_argument("--delivery-per-stream-ms", default="auto", metavar="auto|off|MS",
                   help="the replay's delivery path per stream of a token's step "
                        "(EngineConfig.delivery_per_stream_s): auto: fitted from the runs' path records "
                        "(bench.serving.ttft_path.delivery_path), off: one constant (before issue 35), "
                        "or ms")
    p.add_argument("--gateway-loop", choices=("off", "on"), default="on",
                   help="the replay + path models the gateway's event loop (window timers and "
                        "arrivals wait for its token writes; EngineConfig.gateway_loop_*), its terms "
                        "measured from the runs' logs (bench.simulator.gateway_loop; issue 35; default "
                        "on since session 17, off: the form before)")
    p.add_argument("--plan-lead", choices=("profile", "live", "profile-kinds"), default="live",
                   help="the replay + path's async plan lead: the profile's, or measured on the step "
                        "log after decode-only and prefill steps (bench.simulator.plan_lead; issue 35), "
                        "or the profile's two leads by kind of step (its plan_lead_ms; "
                        "profile_plan_leads); default live since session 17 (profile: the form "
                        "before; on the CPU there is no lead either way)")
    p.add_argument("--json", dest="json_out", metavar="OUT")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _log(a, msg: str) -> None:
    if not getattr(a, "quiet", False):
        print(f"[validate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _late_stop(signum, frame) -> None:
    """A stop signal after the runs ended: what they measured is scored and written first."""
    print(f"[validate] signal {signum} after the runs: scoring and writing what they measured first",
          file=sys.stderr, flush=True)


def validate(a: argparse.Namespace) -> dict:
    from gateway.serve import build_parser as serve_parser
    from gateway.serve import gateway_config
    from sims.profile_cost import ProfileCost

    if a.burstiness <= 0:
        raise ValueError(f"--burstiness must be > 0, got {a.burstiness}")
    k_arg = getattr(a, "delivery_per_stream_ms", "auto")
    if k_arg not in ("auto", "off") and not (math.isfinite(float(k_arg)) and float(k_arg) >= 0):
        raise ValueError(f"--delivery-per-stream-ms must be auto, off or ms >= 0, got {k_arg}")
    dec_path = Path(a.decision_log) if a.decision_log else Path(
        tempfile.mkdtemp(prefix="tidegate-validate-")) / "decisions.jsonl"
    dec_path.parent.mkdir(parents=True, exist_ok=True)
    dec_path.unlink(missing_ok=True)
    # the backend's step log (written when it stops), beside the decision log
    step_path = Path(a.step_log) if a.step_log else dec_path.with_name("steps.jsonl")
    step_path.unlink(missing_ok=True)
    # speculation off unless asked for (`--engine-arg=--speculation --engine-arg on`): the replay
    # below simulates one token per decode step; speculation's own simulator-vs-live comparison
    # is bench.simulator.spec_validate
    serve_argv = ["--port", "0", "--model", a.model, "--device", a.device, "--log-level", "warning",
                  "--decision-log", str(dec_path), "--step-log", str(step_path),
                  "--speculation", "off", *a.engine_arg, *a.serve_arg]
    gw = gateway_config(serve_parser().parse_args(serve_argv), ["live"])
    load_profile = os.getloadavg()
    t_prof = time.perf_counter()
    profile, measured, check = ensure_checked_profile(a)
    t_prof = time.perf_counter() - t_prof
    doc = json.loads(profile.read_text())
    plan_lead = async_plan_lead(doc, a.device)
    kind_leads = None
    if getattr(a, "plan_lead", "profile") == "profile-kinds":  # before any live run: a clear error
        try:
            kind_leads = profile_plan_leads(doc, str(profile))
        except ValueError as e:
            raise SystemExit(str(e)) from None
    terms = model_terms(doc, plan_lead, getattr(a, "hide_launch", "auto"), getattr(a, "power_cap", "auto"),
                        getattr(a, "cap_by_power", "auto"))
    cost = ProfileCost.from_json(profile, **terms)
    max_num_seqs, max_nbt = int(doc["max_num_seqs"]), int(doc["max_num_batched_tokens"])
    live_cap = live_prefill_cap(a.device, a.engine_arg)
    max_d = capacity_batch_limit(doc, getattr(a, "capacity_max_batch", 64))
    in_spec, out_spec = length_spec(a.input_len), length_spec(a.output_len)
    cap = capacity_estimate(cost, typical_len(in_spec), typical_len(out_spec), max_num_seqs, max(1, max_d))
    if a.rates:
        rates = [float(x) for x in a.rates.split(",")]
        labels = [f"{r / cap['request_rate']:.2f}x" for r in rates]
    else:
        fracs = [float(x) for x in a.loads.split(",")]
        rates = [f * cap["request_rate"] for f in fracs]
        labels = [f"{f:g}x" for f in fracs]
    seeds = [int(x) for x in a.seeds.split(",")]
    _log(a, f"profile {profile} ({'measured' if measured else 'cached'}, {len(doc['points'])} points); "
            f"capacity estimate {cap['request_rate']:.2f} req/s at decode batch {cap.get('decode_batch')}; "
            f"rates {', '.join(f'{r:.2f}' for r in rates)} req/s")
    result = {"config": {**{k: v for k, v in vars(a).items()}, "serve_argv": serve_argv,
                         "batcher": vars_of(gw.batcher), "queue_max_requests": list(gw.queues.max_requests),
                         # the live engine's prefill cap (its replay needs it: fidelity_resim)
                         "prefill_cap": vars_of(live_cap)},
              "profile": {"path": str(profile), "measured_now": measured, "seconds": t_prof,
                          **({"check": check} if check is not None else {}),
                          "loadavg_before": load_profile,
                          **{k: v for k, v in doc.items() if k != "points"},
                          "num_points": len(doc["points"]), "cost_model": cost.describe(),
                          "async_plan_lead_ms": None if plan_lead is None else plan_lead * 1e3,
                          "model_terms": terms},
              "capacity_estimate": cap, "loads": []}
    by_load: dict[int, list] = {i: [] for i in range(len(rates))}
    run_steps: list[tuple] = []  # (load index, run index, its request ids, simulated prefill steps)
    old: dict = {}  # the stop signals' handlers before the runs, put back once the result is whole
    try:
        with LiveServer(serve_argv, a.startup_timeout) as srv:
            _log(a, f"live: {srv.url} (model {srv.model}, {srv.num_blocks} KV blocks of {srv.block_size})")
            if srv.backend_line:
                _log(a, f"live backend: {srv.backend_line}")
            num_blocks = srv.num_blocks or int(doc["num_kv_blocks"])
            block_size = srv.block_size or int(doc["block_size"])
            max_model_len = srv.max_model_len or int(doc["max_model_len"])
            result["live_backend"] = {"num_kv_blocks": srv.num_blocks, "block_size": srv.block_size,
                                      "ready_line": srv.backend_line,
                                      "max_model_len": srv.max_model_len, "url": srv.url,
                                      "profile_num_kv_blocks_match": srv.num_blocks == doc["num_kv_blocks"]}
            if a.warmup_requests:
                run_live(srv.url, srv.model, a.warmup_requests, max(rates[0], 1.0), in_spec,
                         out_spec, 10_000, a.request_timeout, prompts_seed=0)
            result["decision_log"] = str(dec_path)
            # A device call's timeout (SIGINT from `timeout -s INT`, SIGTERM from a plain `timeout`)
            # stops the runs, not the session: the runs done so far are scored and written, as a
            # validate JSON marked "interrupted" (its unfinished run is dropped), so that a part cut
            # short keeps what it measured (before: the whole call's JSON was lost).
            # SIGINT's too, not the one inherited: a process that ran a worker or gateway before (a test
            # runner's, session 34) may hold their handler or SIG_IGN, and the cut would go unseen.
            if threading.current_thread() is threading.main_thread():  # signals go to the main thread only
                old.update({sig: signal.signal(sig, signal.default_int_handler)
                            for sig in (signal.SIGTERM, signal.SIGINT)})
            try:
                _live_runs(a, srv, seeds, rates, labels, dec_path, by_load, run_steps, result,
                           profile, num_blocks, block_size, max_model_len, max_num_seqs, max_nbt, gw,
                           in_spec, out_spec, plan_lead, live_cap, terms)
            except KeyboardInterrupt:
                done = sum(map(len, by_load.values()))
                result["interrupted"] = {"runs_done": done, "runs_planned": len(seeds) * len(rates)}
                result["config"]["interrupted"] = True  # its logs hold a prefix of the plan (prompt_identity)
                _log(a, f"interrupted: scoring the {done} of {len(seeds) * len(rates)} runs done")
                # a run whose live part ended but whose comparison did not: dropped
                run_steps[:] = [r for r in run_steps if r[1] < len(by_load[r[0]])]
            finally:
                # After the runs a stop signal stops nothing: the service's shutdown and the scoring below
                # run to the end and the caller writes the JSON (session 36 lost a whole 33B part, all nine
                # runs done, to a `timeout -s INT` that landed 7 s after the last one, while the service
                # shut down). A device call's hard limit still ends the process.
                for sig in old:
                    signal.signal(sig, _late_stop)
        _score_steps(a, result, step_path, dec_path, cost, by_load, run_steps, plan_lead, kind_leads)
        for li, rate in enumerate(rates):
            if not by_load[li]:  # interrupted before this load ran
                continue
            result["loads"].append({"load_label": labels[li], "rate": rate,
                                    "load_fraction": rate / cap["request_rate"], "runs": by_load[li],
                                    "summary": summarize_load(by_load[li], a.confidence),
                                    "summary_scaled": summarize_load(
                                        [{"compare": r["compare_scaled"]} for r in by_load[li]], a.confidence),
                                    "summary_replay": summarize_load(
                                        [{"compare": r["compare_replay"]} for r in by_load[li]], a.confidence),
                                    "decisions": decisions_summary(by_load[li], a.confidence),
                                    **({"summary_replay_path": summarize_load(
                                        [{"compare": r["compare_replay_path"]} for r in by_load[li]],
                                        a.confidence)} if all("compare_replay_path" in r for r in by_load[li])
                                       else {}),
                                    "steps": steps_summary(by_load[li], a.confidence),
                                    **({"steps_path": steps_summary([{"steps": r["steps_path"]} for r in by_load[li]],
                                                                    a.confidence)}
                                       if all("steps_path" in r for r in by_load[li]) else {}),
                                    "ttft_path_ms": _mean_parts([r.get("ttft_path_ms") for r in by_load[li]]),
                                    "scale": mean_ci([r["scale"] for r in by_load[li]], a.confidence)})
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    result["loadavg_after"] = os.getloadavg()
    return result


def _live_runs(a, srv, seeds, rates, labels, dec_path, by_load, run_steps, result, profile, num_blocks,
               block_size, max_model_len, max_num_seqs, max_nbt, gw, in_spec, out_spec, plan_lead,
               live_cap, terms) -> None:
    """Every (seed, load) run against the live service, each beside its simulation and replay:
    appends to `by_load` (load index -> runs) and `run_steps` (`validate`)."""
    from bench.simulator.decision_fidelity import compare as decision_compare

    for seed in seeds:
        for li, rate in enumerate(rates):
                time.sleep(a.settle_s)
                la = os.getloadavg()
                offset = dec_path.stat().st_size if dec_path.exists() else 0
                t0 = time.perf_counter()
                records: list = []
                live = run_live(srv.url, srv.model, a.num_requests, rate, in_spec, out_spec,
                                seed, a.request_timeout, a.burstiness, prompt_seed(seed, li), records)
                wall = time.perf_counter() - t0
                spec = sim_spec(profile, num_blocks, block_size, max_model_len, max_num_seqs, max_nbt,
                                gw.batcher, gw.queues, a.num_requests, rate, in_spec,
                                out_spec, seed, a.burstiness, plan_lead, live_cap, terms)
                sim = run_sim(spec)
                cmp_ = compare(live, sim)
                arrivals, live_batches = read_decisions(dec_path, offset)
                sim_replay, sim_batches, sim_steps = run_replay(spec, arrivals)
                run_steps.append((li, len(by_load[li]), {x.request_id for x in arrivals},
                                  prefill_steps_of(sim_steps, {x.request_id for x in arrivals}),
                                  (records, arrivals, live_batches, spec, live)))
                decisions = decision_compare(live_batches, sim_batches)
                front = [1e3 * (x.t - x.received) for x in arrivals if x.received is not None]
                # Diagnostic, not validation: the same simulation with the profile's step times
                # scaled so that the simulated ITL P50 equals the live one (one live statistic fed
                # back); what remains is the error of everything but the cost model's level.
                scale = cmp_["itl_p50"]["live"] / cmp_["itl_p50"]["sim"] if cmp_["itl_p50"]["sim"] else 1.0
                sim_scaled = run_sim(spec, scale)
                cmp_scaled = compare(live, sim_scaled)
                if live["num_errors"]:
                    _log(a, f"  live run had {live['num_errors']} failed requests: {live['errors']}")
                by_load[li].append({"seed": seed, "rate": rate, "loadavg_before": la, "live_wall_s": wall,
                                    "live_completed": live["completed"], "live_errors": live["errors"],
                                    "sim_completed": sim["completed"], "compare": cmp_,
                                    "scale": scale, "compare_scaled": cmp_scaled,
                                    "compare_replay": compare(live, sim_replay),
                                    "decisions": decisions,
                                    "frontend_ms": {"mean": float(np.mean(front)) if front else math.nan,
                                                    "max": max(front, default=math.nan)},
                                    "live": _slim(live), "sim": _slim(sim),
                                    "sim_steps": sim.get("steps"), "sim_batch_size": sim.get("batch_size")})
                _log(a, f"  load {labels[li]} rate {rate:.2f} seed {seed}: "
                        + ", ".join(f"{k} {v['live']:.2f}/{v['sim']:.2f} ({100 * v['rel_err']:+.0f}%)"
                                    for k, v in cmp_.items()) + f"  [loadavg {la[0]:.2f}]; windows "
                        f"same {100 * decisions['same_membership_share']:.1f}% of "
                        f"{decisions['num_batches']}")


def _score_steps(a, result, step_path, dec_path, cost, by_load, run_steps, plan_lead, kind_leads) -> None:
    """After the service stopped: its step log against each run's simulated steps, the cost model
    at every live step, and the delivery path put back into the replays (`validate`)."""
    # the backend wrote its step log when it stopped: compare each run's prefill steps
    if step_path.exists():
        from bench.serving.ttft_path import decompose
        from bench.simulator.decision_fidelity import compare_steps
        from scheduler.decisions import read_steps
        try:
            live_steps = read_steps(str(step_path))
        except ValueError as exc:
            live_steps = None
            _log(a, f"step log not compared: {exc}")
        if live_steps is not None:
            step_rows = [json.loads(x) for x in step_path.read_text().splitlines() if x.strip()]
            # the cost model at every live step (issue 35: bench.simulator.fidelity_steps), by kind
            from bench.simulator.fidelity_steps import live_steps as rebuild
            from bench.simulator.fidelity_steps import step_cost_table
            from scheduler.decisions import read_log
            every, _ = read_log(str(dec_path))
            rebuilt, bad = rebuild(step_rows, {x.request_id: x.max_tokens for x in every})
            result["step_cost"] = {"rows": step_cost_table(cost, rebuilt), "rebuild_mismatches": bad}
            for li, ri, ids, sim_pre, (records, arrivals, live_batches, _, _) in run_steps:
                by_load[li][ri]["steps"] = compare_steps(prefill_steps_of(live_steps, ids), sim_pre)
                path = decompose(records, arrivals, live_batches, step_rows, per_request=True)
                # each request's out / to_step and its first token's step's sequences: the path's
                # growth with load, for a model of it (issue 35)
                by_load[li][ri]["ttft_path_requests"] = path.pop("per_request")
                by_load[li][ri]["ttft_path_ms"] = path
            # The path the simulator does not model (client -> gateway, backend -> client),
            # measured per request at the lowest load, then used at every load as the model's
            # delivery delay: a measured component, not a fit of the compared figures.
            # Live the path grows with the streams of the token's step (issue 35: ~70 us a stream
            # on the H200, the gateway's and the client's work on every stream's token): the
            # model's per-stream cost is fitted from the runs' path records (a measured cost of
            # the gateway, as gateway_message_s is), or given (--delivery-per-stream-ms).
            def path_of(r):
                return r["ttft_path_ms"], r.get("ttft_path_requests")

            low = [path_of(r) for r in by_load[0] if r.get("ttft_path_ms", {}).get("num_requests")]
            if low:
                from bench.serving.ttft_path import delivery_path
                from bench.simulator.fidelity_steps import dispatch_delay

                k_arg = getattr(a, "delivery_per_stream_ms", "auto")
                model = delivery_path(low, [path_of(r) for runs_ in by_load.values() for r in runs_
                                            if r.get("ttft_path_ms", {}).get("num_requests")],
                                      None if k_arg == "auto" else 0.0 if k_arg == "off" else float(k_arg))
                result["delivery_path"] = model
                delivery_ms, per_stream_ms = model["base_ms"], model["per_stream_ms"]
                result["delivery_delay_ms"] = delivery_ms
                # and the way in: gateway flush -> the backend's plan, measured on the requests
                # that found the engine idle (issue 35: 1.09 ms on the H200, 0 in the model before)
                net_s, num_idle = dispatch_delay(step_rows, [b for *_, (_, _, bs, _, _) in run_steps for b in bs])
                result["dispatch_delay_ms"] = {"median": 1e3 * net_s, "num_requests": num_idle}
                # opt-in (issue 35): the gateway's event loop, the engine's live plan lead
                extra_engine = {}
                if getattr(a, "gateway_loop", "off") == "on":
                    from bench.simulator.gateway_loop import engine_fields, measure
                    session = {"config": {"batcher": result["config"]["batcher"]},
                               "loads": [{"runs": by_load[0]}]}
                    by_run = {(ri, li): (arrivals, bs) for li, ri, _, _, (_, arrivals, bs, _, _) in run_steps}
                    result["gateway_loop"] = terms = measure(session, by_run, step_rows, model)
                    extra_engine.update(engine_fields(terms))
                if plan_lead is not None and (kind_leads is not None or
                                              getattr(a, "plan_lead", "profile") == "live"):
                    from bench.simulator import plan_lead as lead_model
                    # the profile's two leads (profile-kinds), or the ones the step log measured
                    result["plan_leads"] = pl = kind_leads or lead_model.plan_leads(step_rows)
                    extra_engine.update(lead_model.engine_fields(pl))
                for li, ri, ids, _, (_, arrivals, _, spec, live) in run_steps:
                    spec_d = replace(spec, engine=replace(spec.engine, delivery_delay_s=delivery_ms / 1e3,
                                                          delivery_per_stream_s=per_stream_ms / 1e3,
                                                          network_delay_s=net_s, **extra_engine))
                    sim_d, _, steps_d = run_replay(spec_d, arrivals)
                    by_load[li][ri]["compare_replay_path"] = compare(live, sim_d)
                    by_load[li][ri]["steps_path"] = compare_steps(prefill_steps_of(live_steps, ids),
                                                                  prefill_steps_of(steps_d, ids))
        result["step_log"] = str(step_path)


def vars_of(obj) -> dict:
    from dataclasses import asdict
    return asdict(obj)


def _slim(rep: dict) -> dict:
    keys = ("completed", "duration_s", "request_throughput", "output_throughput", "ttft_ms", "tpot_ms",
            "itl_ms", "e2el_ms")
    return {k: rep[k] for k in keys if k in rep}


def _default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        result = validate(a)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"tidegate sim validate: {exc}", file=sys.stderr)
        return 1
    stopped = result.get("interrupted")
    if stopped:
        print(f"tidegate sim validate: interrupted after {stopped['runs_done']} of {stopped['runs_planned']} runs; "
              "the JSON holds those", file=sys.stderr)
    _write_json(a, result)  # before the tables: a stop signal while they print loses nothing
    if not result["loads"]:  # interrupted before the first run ended: nothing to tabulate
        return 130
    print(format_table(result))
    print("\ndiagnostic: the same simulations with the profile's step times scaled per run so that the "
          "simulated ITL P50 equals the live one (scale = live/sim ITL P50: "
          + ", ".join(f"{ld['load_label']} {ld['scale']['mean']:.2f}" for ld in result["loads"]) + ")")
    print(format_table(result, "summary_scaled"))
    print("\nreplay: the gateway's recorded arrivals simulated again (no send jitter, no front end)")
    print(format_table(result, "summary_replay"))
    if "delivery_delay_ms" in result and all("summary_replay_path" in ld for ld in result["loads"]):
        dd = result.get("dispatch_delay_ms", {})
        print(f"\nreplay + delivery path: the same, with the client <-> gateway and backend -> client "
              f"path measured at the lowest load ({result['delivery_delay_ms']:.2f} ms + "
              f"{result.get('delivery_path', {}).get('per_stream_ms', 0.0):.3f} ms a stream of the token's step, "
              "bench.serving.ttft_path) "
              f"as the model's delivery delay, and the gateway -> backend plan measured on the requests that "
              f"found the engine idle ({dd.get('median', 0.0):.2f} ms, {dd.get('num_requests', 0)} requests) "
              "as its network delay")
        print(format_table(result, "summary_replay_path"))
        # the first table simulates the workload afresh; the fidelity figures (`bench.simulator.fidelity_table`,
        # BENCHMARKS) are this one's: the live run's own arrivals, with the path the model does not simulate
        print("(the fidelity figure is this last table: `python -m bench.simulator.fidelity_table <this JSON>` gives "
              "it with its 95% intervals)")
    for ld in result["loads"]:
        d = ld["decisions"]
        s = d["same_membership_share"]
        ci = "" if not np.isfinite(s["ci"]) else f" ±{100 * s['ci']:.1f}"
        print(f"decisions {ld['load_label']}: windows with the same membership {100 * s['mean']:.1f}%{ci} "
              f"(pooled {100 * d['same_membership_pooled']:.1f}% of {d['num_batches_live']} live windows; "
              f"{d['requests_regrouped']} requests regrouped; front end {d['frontend_ms_mean']:.2f} ms "
              f"before the batcher)")
        st = ld.get("steps")
        if st:
            print(f"steps {ld['load_label']}: prefill steps with the same chunks "
                  f"{100 * st['same_prefill_step_share']['mean']:.1f}%, requests chunked alike "
                  f"{100 * st['requests_chunked_alike']['mean']:.1f}% (prefill steps live/sim "
                  f"{st['num_prefill_steps'][0]}/{st['num_prefill_steps'][1]}, preemptions "
                  f"{st['preemptions'][0]}/{st['preemptions'][1]})")
        sp = ld.get("steps_path")
        if sp:
            print(f"steps {ld['load_label']} (replay + paths): prefill steps with the same chunks "
                  f"{100 * sp['same_prefill_step_share']['mean']:.1f}%")
        tp = ld.get("ttft_path_ms")
        if tp:
            print(f"TTFT path {ld['load_label']} (live medians, ms; bench.serving.ttft_path): "
                  + ", ".join(f"{k} {tp[k]:.2f}" for k in ("http_in", "front", "window", "to_step",
                                                          "prefill", "out", "ttft"))
                  + f" ({tp['num_requests']:.0f} requests a run, {tp['mismatched']} unmatched)")
    if result.get("step_cost"):
        from bench.simulator.fidelity_steps import format_cost_table
        print(f"\nthe cost model at the live steps (model / live, of the totals; decode counts rebuilt wrong in "
              f"{result['step_cost']['rebuild_mismatches']} steps; bench.simulator.fidelity_steps)")
        print(format_cost_table(result["step_cost"]["rows"]))
    cap = result["capacity_estimate"]
    print(f"capacity estimate (profile): {cap['request_rate']:.2f} req/s; seeds {a.seeds}; "
          f"{a.num_requests} requests of {a.input_len}+{a.output_len} tokens per run; goal ±{100 * GOAL:.0f}%; "
          f"loadavg {result['profile']['loadavg_before'][0]:.2f} at profiling, "
          f"{result['loadavg_after'][0]:.2f} at the end")
    return 130 if stopped else 0


def _write_json(a, result: dict) -> None:
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.json_out, "w") as fh:
            json.dump(result, fh, indent=2, default=_default)
            fh.write("\n")
