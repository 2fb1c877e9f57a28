"""Issue 35, session 21: where the simulated TTFT parts from live, every live step time fed back
(`validate_replay --live-times`, the grid state's model otherwise): per load, the window (push ->
flush), flush -> the request's first prefill step (to_step) and flush -> first token, means over
the requests, then per request (matched by id) the simulation's minus live's.
Run from the repo root:  python ttft_split.py PART_DIR SEED [live|model]"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import sims.decision_replay as dr
from bench.simulator import validate_replay as vr
from bench.simulator.fidelity_steps import read_steps
from scheduler.decisions import read_log

part = Path(sys.argv[1]); seed = int(sys.argv[2]); tag = part.name
live_times = (sys.argv[3] if len(sys.argv) > 3 else "live") == "live"
caught = []
orig = dr.replay_run
def wrap(arr, *a, **k):
    res, b = orig(arr, *a, **k); caught.append((arr, res, b)); return res, b
dr.replay_run = wrap
validate = json.loads((part / f"validate_{tag}.json").read_text())
arrivals, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
rows = read_steps(part / f"steps_{tag}.jsonl.gz")
res = vr.replay_session(validate, arrivals, batches, rows, str(part / f"profile_{tag}.json"), seeds={seed},
                        cap_by_power=True, gateway_loop=True, live_times=live_times, plan_lead="live")
by_run = vr.run_arrivals(validate, arrivals, batches)
runs = [(si, li) for li, ld in enumerate(validate["loads"]) for si, r in enumerate(ld["runs"]) if int(r["seed"]) == seed]
for (si, li), (arr, simres, sim_b) in zip(runs, caught):
    a_live, b_live = by_run[(si, li)]
    push = {a.request_id: a.t for a in a_live}
    flush = {r: b.t for b in b_live for r in b.request_ids}
    first_start, last_end = {}, {}
    for row in rows:
        if "mono" not in row: continue
        for rid, _, _ in row.get("prefill", ()):
            first_start.setdefault(rid, row["mono"]); last_end[rid] = row["mono"] + row["ms"] / 1e3
    run = validate["loads"][li]["runs"][si]
    tp = run["ttft_path_ms"]
    ids = [a.request_id for a in sorted(arr, key=lambda a: a.t)]
    w = simres.workload
    sim_win = (simres.dispatch_time - w.arrival_time) * 1e3
    sim_post = (simres.first_token_time - simres.dispatch_time) * 1e3
    lw = np.array([(flush[r] - push[r]) * 1e3 for r in ids if r in flush])
    lp = np.array([(last_end[r] - flush[r]) * 1e3 for r in ids if r in flush and r in last_end])
    sim_steps = dr.step_records(simres, arr)
    sfs = {}
    for s in sim_steps:
        for rid, _, _ in s.prefill if hasattr(s, "prefill") else s[2]:
            sfs.setdefault(rid, s.t if hasattr(s, "t") else s[0])
    disp = dict(zip(ids, simres.dispatch_time))
    sim_to_step = np.array([(sfs[r] - disp[r]) * 1e3 for r in ids if r in sfs])
    live_to_step = np.array([(first_start[r] - flush[r]) * 1e3 for r in ids if r in first_start and r in flush])
    print(f"{validate['loads'][li]['load_label']:>6} window live {lw.mean():6.2f} sim {np.nanmean(sim_win):6.2f} | "
          f"to_step live {live_to_step.mean():6.2f} sim {sim_to_step.mean():6.2f} | flush->last prefill end live {lp.mean():6.2f} | "
          f"flush->first token sim {np.nanmean(sim_post):6.2f} live(to_step+prefill+out) {tp['to_step']+tp['prefill']+tp['out']:6.2f} (medians) | "
          f"ttft cmp {res['loads'][li]['runs'][0]['compare_replay_path']['ttft_p50']}")
    # per request, matched: live post-flush = last prefill end - flush + out (out in send order = received order)
    recv = sorted((a for a in a_live if a.received is not None), key=lambda a: a.received)
    outs = dict(zip([a.request_id for a in recv], run["ttft_path_requests"]["out_ms"]))
    ft = dict(zip(ids, simres.first_token_time))
    dw, dp, dpre, dout = [], [], [], []
    for k, r in enumerate(ids):
        if r not in flush or r not in last_end or r not in outs or r not in sfs: continue
        lwin = flush[r] - push[r]; swin = disp[r] - push[r]
        lpost = last_end[r] - flush[r] + outs[r] / 1e3; spost = ft[r] - disp[r]
        dw.append(swin - lwin); dp.append(spost - lpost)
        dpre.append((sfs[r] - disp[r]) - (first_start[r] - flush[r]))
    dw, dp, dpre = (1e3 * np.array(x) for x in (dw, dp, dpre))
    print(f"        per request sim-live: window mean {dw.mean():+.2f} med {np.median(dw):+.2f} | to_step mean {dpre.mean():+.2f} med {np.median(dpre):+.2f} | post-flush mean {dp.mean():+.2f} med {np.median(dp):+.2f} | http_in live {tp['http_in']:.2f} front {tp['front']:.2f} out(med) {tp['out']:.2f}")
