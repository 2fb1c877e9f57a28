"""Issue 31, eighth session: where dispatch -> first token goes live, part by part, against the
forced replay, for a run traced with trace/sitecustomize.py (TIDEGATE_LAG_TRACE=RUN/trace).

Per admitted request of gateway A (times on CLOCK_MONOTONIC, ms):
  W  the window's flush (decision log "batch")
  S  its Batch's send began (gateway trace "send")      gateway: S - W (placement, the Batches
                                                         sent before its own)
  R  its receipt on the backend (backend trace "recv")   the rest of the backend's step under way
                                                         at S (residual, modelled) + the rest (wire,
                                                         loop): R - S
  P  the start of the step that admitted it               backend: P - R (rest of a step, slots)
  E  that step's end                                      the step: E - P
  O  its outputs' send began                              backend: O - E
  G  the gateway read them (first "now")                  wire + gateway loop: G - O
  C  the client's first token (~ received + ttft_s)       gateway -> client: C - G
Replay (forced to the live decisions, same windows): its flush Ws, its start Ps (first token less
one step), its first token.

    .venv/bin/python bench/results/slo_lag_s8/lag_parts.py RUN [--step-ms 20] [--json OUT]
"""
import argparse
import glob
import gzip
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.getcwd())
from scheduler.batcher import BatcherConfig
from scheduler.decisions import parse_records
from scheduler.placement import PlacementConfig
from scheduler.slo import SLOTargets
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import replay_run
from sims.event_loop import EngineConfig


def _open(p: Path):
    return open(p) if p.exists() else gzip.open(str(p) + ".gz", "rt")


def _open_any(f: str):
    return gzip.open(f, "rt") if f.endswith(".gz") else open(f)


def load_trace(run: Path):
    tdir = run / "trace"
    send, first, win = {}, {}, []
    for f in glob.glob(str(tdir / "gw_*.jsonl*")):
        with _open_any(f) as fh:
            gw_rows = [json.loads(line) for line in fh]
        for r in gw_rows:
            if r[0] == "send":
                for rid in r[3]:
                    send[rid] = (r[1], r[2])
            elif r[0] == "first":
                first[r[1]] = (r[2], r[3])
            elif r[0] == "win":
                win.append((r[1], r[2], len(r[3])))
    recv, start, steps_all, step_ends = {}, {}, [], {}
    for f in glob.glob(str(tdir / "be_*.jsonl*")):
        with _open_any(f) as fh:
            rows = [json.loads(line) for line in fh]
        outs = np.array(sorted(r[1] for r in rows if r[0] == "out"))
        steps = [r for r in rows if r[0] == "step"]
        steps_all.append(steps)
        se = (np.array([s[1] for s in steps]), np.array([s[2] for s in steps]))
        for r in rows:
            if r[0] == "recv":
                recv[r[2]] = r[1]
                step_ends[r[2]] = se
        for s in steps:
            j = np.searchsorted(outs, s[2])
            o = outs[j] if j < len(outs) else np.nan
            for rid in s[3]:
                start.setdefault(rid, (s[1], s[2], o))
    return send, first, win, recv, start, steps_all, step_ends


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--slo-ttft-ms", default="fast=750,normal=1000,slow=1600")
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    run = Path(a.run)
    with _open(run / "decisions_a.jsonl") as fh:
        arr, live = parse_records(fh)
    send, first, win, recv, start, steps_all, step_ends = load_trace(run)
    slo = SLOTargets.parse(a.slo_ttft_ms, None)
    sched = SimSchedulerConfig(batcher=BatcherConfig(128, 600, 1, 0.8, False), slo=slo,
                               admission=True, waiting_by_class=True, slot_model=True,
                               max_num_seqs=8)
    res, _ = replay_run(arr, sched, ConstantCost(a.step_ms / 1e3, num_blocks=1 << 14),
                        EngineConfig(num_samples=1, num_backends=4,
                                     placement=PlacementConfig(policy="ttft")), forced=True)
    o = sorted(arr, key=lambda r: r.t)
    idx = {r.request_id: i for i, r in enumerate(o)}
    flush = {rid: b.t for b in live for rid in b.request_ids}
    with _open(run / "records_a.jsonl") as fh:
        recs = [json.loads(line) for line in fh]
    main_arr = [r for r in o if not (r.slo_ttft_ms or 0) > 1e6]
    client = {}
    if len(main_arr) == len(recs):
        for r, rec in zip(main_arr, recs):
            if rec["ttft_s"] is not None and rec["error"] is None:
                client[r.request_id] = (r.received or r.t) + rec["ttft_s"]
    step_s = a.step_ms / 1e3
    rows = []
    for r in o:
        rid = r.request_id
        if r.refused or rid not in flush or rid not in start or rid not in send or rid not in recv:
            continue
        i = idx[rid]
        W, (S, _pid), R = flush[rid], send[rid], recv[rid]
        P, E, O = start[rid]
        G = first.get(rid, (np.nan, np.nan))[0]
        C = client.get(rid, np.nan)
        ws = res.dispatch_time[i]
        ps = res.first_token_time[i] - step_s
        t0s, t1s = step_ends[rid]
        j = np.searchsorted(t0s, S) - 1  # the step under way at S, if any
        resid = t1s[j] - S if j >= 0 and t1s[j] > S else 0.0
        rows.append((r.queue_class, W, S, R, P, E, O, G, C, ws, ps, resid))
    d = np.array(rows)
    ms = lambda x: x * 1e3
    parts = {"gateway S-W": ms(d[:, 2] - d[:, 1]), "step under way at S": ms(d[:, 11]),
             "wire+loop R-S-resid": ms(d[:, 3] - d[:, 2] - d[:, 11]),
             "backend wait P-R": ms(d[:, 4] - d[:, 3]), "step E-P": ms(d[:, 5] - d[:, 4]),
             "outputs O-E": ms(d[:, 6] - d[:, 5]), "wire+gateway G-O": ms(d[:, 7] - d[:, 6]),
             "gateway->client C-G": ms(d[:, 8] - d[:, 7])}
    live_start = ms(d[:, 4] - d[:, 1])  # W -> P live
    sim_start = ms(d[:, 10] - d[:, 9])  # Ws -> Ps replay
    out = {"run": run.name, "n": len(d)}
    print(run.name, "admitted traced", len(d))
    for k, v in parts.items():
        q = np.nanquantile(v, [0.1, 0.5, 0.9])
        print(f"  {k:24s} mean {np.nanmean(v):7.2f}  p10/p50/p90 {q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f}")
        out[k] = [float(np.nanmean(v)), *map(float, q)]
    flush_late = ms(d[:, 1] - d[:, 9])
    print(f"  live flush - replay flush: p50 {np.nanmedian(flush_late):.2f} ms, mean {np.nanmean(flush_late):.2f}")
    wt = np.array([(w[1] - w[0]) * 1e3 for w in win]); wn = np.array([w[2] for w in win])
    print(f"  gateway time per window (place + send): mean {wt.mean():.2f} ms, p90 {np.quantile(wt, .9):.2f}, "
          f"per request {wt.sum() / wn.sum() * 1e3:.0f} us, windows {len(wt)} mean size {wn.mean():.1f}")
    out["window_ms"] = [float(wt.mean()), float(np.quantile(wt, .9))]
    st = np.concatenate([[s[2] - s[1] for s in ss] for ss in steps_all]) * 1e3
    gaps = np.concatenate([[b[1] - a_[2] for a_, b in itertools.pairwise(ss) if b[1] - a_[2] < 0.05]
                           for ss in steps_all]) * 1e3
    print(f"  backend step: mean {st.mean():.2f} ms p50 {np.median(st):.2f} p90 {np.quantile(st, .9):.2f};"
          f" gap between busy steps mean {gaps.mean():.2f} p90 {np.quantile(gaps, .9):.2f} -> cadence {st.mean() + gaps.mean():.2f}")
    out["step_ms"], out["gap_ms"] = float(st.mean()), float(gaps.mean())
    diff = live_start - sim_start
    print(f"  flush -> start live - replay: p10/p50/p90 {np.round(np.nanquantile(diff, [.1, .5, .9]), 1)}")
    for lo, hi in ((0, 25), (25, 50), (50, 200), (200, 500), (500, 1e5)):
        m = (sim_start >= lo) & (sim_start < hi)
        if not m.sum():
            continue
        sub = {k: float(np.nanmedian(v[m])) for k, v in parts.items()}
        print(f"  replay flush->start {lo}-{hi} ms: n {m.sum()} live-replay p50 {np.nanmedian(diff[m]):+.1f} ms; "
              f"live medians " + ", ".join(f"{k.split()[-1]} {x:.1f}" for k, x in sub.items()))
        out[f"bin_{lo}_{hi}"] = {"n": int(m.sum()), "diff_p50": float(np.nanmedian(diff[m])), **sub}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
