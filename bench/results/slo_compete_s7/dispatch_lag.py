"""Issue 31, seventh session: dispatch -> first token, live vs the forced replay, request by
request, for a fid_* run of this directory (600 ms window). Live: the client's TTFT less the
window's hold (the live flush time minus the gateway's receipt), which leaves dispatch -> first
token plus the HTTP legs (a few ms); replay: its push -> first token less the same hold (the
forced replay flushes the same windows). From the repository root:

    .venv/bin/python bench/results/slo_compete_s7/dispatch_lag.py bench/results/slo_compete_s7/fid_w15a [STEP_S]
"""
import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
from scheduler.batcher import BatcherConfig
from scheduler.decisions import parse_records
from scheduler.placement import PlacementConfig
from scheduler.slo import SLOTargets
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import replay_run
from sims.event_loop import EngineConfig

run = Path(sys.argv[1]); step = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
with gzip.open(run / "decisions_a.jsonl.gz", "rt") as fh:
    arr, live = parse_records(fh)
slo = SLOTargets.parse("fast=750,normal=1000,slow=1600", None)
sched = SimSchedulerConfig(batcher=BatcherConfig(128, 600, 1, 0.8, False), slo=slo, admission=True,
                           waiting_by_class=True, slot_model=True, max_num_seqs=8)
res, sim_b = replay_run(arr, sched, ConstantCost(step, num_blocks=1 << 14),
                    EngineConfig(num_samples=1, num_backends=4, placement=PlacementConfig(policy="ttft")), forced=True)
o = sorted(arr, key=lambda r: r.t); idx = {r.request_id: i for i, r in enumerate(o)}
flush_live = {rid: b.t for b in live for rid in b.request_ids}
with gzip.open(run / "records_a.jsonl.gz", "rt") as fh:
    recs = [json.loads(line) for line in fh]
main = [r for r in o if not (r.slo_ttft_ms or 0) > 1e6]
d = []
for r, rec in zip(main, recs):
    if rec["ttft_s"] is None or r.refused: continue
    i = idx[r.request_id]
    live_ds = rec["ttft_s"] - (flush_live[r.request_id] - (r.received or r.t))  # dispatch -> first token, approx
    sim_ttft = res.first_token_time[i] - res.workload.arrival_time[i]
    sim_flush_wait = flush_live[r.request_id] - r.t  # forced: same windows, flush at the same time nominally
    d.append((r.t - o[0].t, r.queue_class, live_ds, sim_ttft - sim_flush_wait, rec["ttft_s"], sim_ttft))
d = np.array(d)
diff = (d[:, 2] - d[:, 3]) * 1e3
print(run.name, "n", len(d), "dispatch->first token live minus replay ms p10/p50/p90:", np.round(np.quantile(diff, [0.1, 0.5, 0.9]), 1))
for c in range(3):
    m = d[:, 1] == c
    if m.sum(): print("  class", c, "n", m.sum(), "p50 diff", round(float(np.median(diff[m])), 1), "live ds p50", round(float(np.median(d[m, 2]))*1e3, 1), "replay", round(float(np.median(d[m, 3]))*1e3, 1))
for lo, hi in ((0, 0.05), (0.05, 0.2), (0.2, 0.5), (0.5, 10)):
    m = (d[:, 3] >= lo) & (d[:, 3] < hi)
    if m.sum(): print(f"  replay dispatch->first {lo}-{hi} s: n {m.sum()} live-replay p50 {np.median(diff[m]):.1f} ms, ratio p50 {np.median(d[m,2]/d[m,3]):.3f}")
