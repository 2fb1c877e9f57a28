"""Issue 31, fifteenth session: the session-14 H200 call (scripts/gpu_slo_run.sh at 5f1bf0d, 33B
preset, one backend) replayed in the simulator as one run, so that the backend's prefix cache
lives through the whole call: the warm-up burst (32, seed 9), the capacity burst (400, seed 1,
rate inf), then the admission run's schedule (400, seed 2, 21.822 req/s) and the control run's
(the same schedule: its prompts the admission run's, as the call sent them, or of other content,
as `bench.serving.slo_control` sends them now). No admission (the backend does not read the
gateway's classes or targets; gateway A refused 11 of 400): what the engine does with the work.

    .venv/bin/python bench/results/slo_gpu_model_s15/repro_s14.py \\
        --profile bench/results/fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from sims.event_loop import simulate
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.workload import LengthSpec, ScheduleConfig, Workload, make_prompts, make_schedule

INPUT, OUTPUT = "512", "uniform:2:128"
# (name, seed, requests, rate, start s): the phases of the call, each after the last drained
PHASES = [("warm-up", 9, 32, float("inf"), 0.0), ("capacity burst", 1, 400, float("inf"), 10.0),
          ("admission run (first)", 2, 400, 21.822, 60.0),
          ("control run (second)", 2, 400, 21.822, 110.0)]


def workload(control_same_prompts: bool) -> tuple[Workload, list[tuple[str, int, int]]]:
    times, plen, olen, ids, spans = [], [], [], [], []
    for k, (name, seed, n, rate, start) in enumerate(PHASES):
        s = make_schedule(ScheduleConfig(num_requests=n, rate=rate, input_len=LengthSpec.parse(INPUT),
                                         output_len=LengthSpec.parse(OUTPUT), seed=seed))
        pseed = seed if (k < 3 or control_same_prompts) else seed + 7919  # slo_control's CONTROL_PROMPT_SEED
        spans.append((name, len(times), len(times) + n))
        times += list(start + s.offset)
        plen += list(s.prompt_len)
        olen += list(s.output_len)
        ids += make_prompts(s, pseed, (0, 256))
    n = len(times)
    w = Workload(np.array(times), np.array(plen, dtype=np.int64), np.array(olen, dtype=np.int64),
                 np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int64),
                 np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int64))
    w.prompt_ids = lambda i: ids[i]
    return w, spans


def phase_rows(res, spans) -> list[dict]:
    rows = []
    w = res.workload
    for name, a, b in spans:
        sl = slice(a, b)
        arr, first, fin = w.arrival_time[sl], res.first_token_time[sl], res.finish_time[sl]
        nout = res.num_output[sl]
        ttft = first - arr
        m = nout > 1
        tpot = (fin[m] - first[m]) / (nout[m] - 1)
        rows.append({"phase": name, "requests": b - a,
                     "throughput_rps": (b - a) / (np.nanmax(fin) - arr.min()),
                     "ttft_ms_p50": 1e3 * np.nanpercentile(ttft, 50),
                     "ttft_ms_p90": 1e3 * np.nanpercentile(ttft, 90),
                     "tpot_ms_p50": 1e3 * np.percentile(tpot, 50),
                     "tpot_ms_mean": 1e3 * tpot.mean()})
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, num_requests=400)
    p.add_argument("--out", default=None, help="JSON of both variants' phase rows")
    a = parse_with_config(p, argv + ["--prefix-caching", "on", "--placement", "prefix"])
    spec = spec_from_args(a)
    out = {}
    for same in (True, False):
        w, spans = workload(same)
        res = simulate(w, spec.cost.build(), spec.scheduler, spec.engine)
        label = "control run sends the admission run's prompts (the s14 call)" if same else \
            "control run's prompts of other content (slo_control now)"
        print(f"== {label}")
        print("phase                      req/s  TTFT p50 ms  TTFT p90 ms  TPOT p50 ms  TPOT mean ms")
        rows = phase_rows(res, spans)
        for r in rows:
            print(f"{r['phase']:24s} {r['throughput_rps']:7.2f} {r['ttft_ms_p50']:12.0f} "
                  f"{r['ttft_ms_p90']:12.0f} {r['tpot_ms_p50']:12.1f} {r['tpot_ms_mean']:13.1f}")
        bs = res.backend_stats[0]
        print("prefix hit rate over the whole call:", bs.get("prefix_hit_rate"),
              "preemptions:", bs.get("preemptions"))
        out["same_prompts" if same else "fresh_prompts"] = rows
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
