"""Issue 31, eighth session (from the seventh's fid_join.py, plus the replay's engine knobs below:
the live service's measured delays, `lag_parts.py`): simulator vs live for one `scripts/gpu_slo_run.sh` run, request by
request. Replays the run's decision log (decisions_a.jsonl[.gz]) in the simulator as
`bench.simulator.decision_fidelity` does (free, and forced to the live decisions), joins the
live per-request records (records_a.jsonl[.gz], schedule order; the probes, which carry slo_ttft_ms
1e9, matched to their refusals) and prints: same admission decisions (all arrivals), same
windows, TTFT p50 live vs replay (the admitted on both sides, and each side's own admitted),
and every differing decision with both sides' predictions.

    python bench/results/slo_compete_s7/fid_join.py RUN_DIR --slo-ttft-ms ... [--window-flags ...]
"""
import argparse
import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.getcwd())

from bench.simulator.decision_fidelity import compare, compare_admission
from scheduler.batcher import BatcherConfig
from scheduler.decisions import parse_records
from scheduler.placement import PlacementConfig
from scheduler.slo import SLOTargets
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import predictions_ms, refused_ids, replay_run
from sims.event_loop import EngineConfig

PROBE = 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--slo-ttft-ms", required=True)
    ap.add_argument("--min-latency-ms", type=float, default=BatcherConfig().min_latency_ms)
    ap.add_argument("--target-throughput", type=float, default=BatcherConfig().target_throughput)
    ap.add_argument("--max-batch-size", type=int, default=BatcherConfig().max_batch_size)
    ap.add_argument("--no-idle-flush", action="store_true")
    ap.add_argument("--step-ms", type=float, default=20.0, help="the replay's constant step")
    ap.add_argument("--network-delay-ms", type=float, default=0.0,
                    help="gateway -> backend delay of a Batch (EngineConfig.network_delay_s)")
    ap.add_argument("--gateway-message-us", type=float, default=0.0,
                    help="the gateway's time per Batch, serialized (EngineConfig.gateway_message_s)")
    ap.add_argument("--backend-message-us", type=float, default=0.0,
                    help="the backend's time per Batch, added to its step (backend_message_s)")
    ap.add_argument("--delivery-delay-ms", type=float, default=0.0,
                    help="backend -> client delay of every token (EngineConfig.delivery_delay_s)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    run = Path(a.run)
    path = run / "decisions_a.jsonl"
    if path.exists():
        with open(path) as fh:
            arrivals, live = parse_records(fh)
    else:
        with gzip.open(str(path) + ".gz", "rt") as fh:
            arrivals, live = parse_records(fh)
    slo = SLOTargets.parse(a.slo_ttft_ms, None)
    sched = SimSchedulerConfig(batcher=BatcherConfig(a.max_batch_size, a.min_latency_ms,
                                                     a.target_throughput, 0.8, not a.no_idle_flush),
                               slo=slo, admission=True, waiting_by_class=True, slot_model=True,
                               max_num_seqs=8)
    cost = ConstantCost(a.step_ms / 1e3, num_blocks=1 << 14)
    eng = EngineConfig(num_samples=1, num_backends=4, placement=PlacementConfig(policy="ttft"),
                       network_delay_s=a.network_delay_ms / 1e3,
                       gateway_message_s=a.gateway_message_us / 1e6,
                       backend_message_s=a.backend_message_us / 1e6,
                       delivery_delay_s=a.delivery_delay_ms / 1e3)
    result, sim = replay_run(arrivals, sched, cost, eng)
    forced, forced_w = replay_run(arrivals, sched, cost, eng, forced=True)
    ordered = sorted(arrivals, key=lambda r: r.t)
    idx = {r.request_id: i for i, r in enumerate(ordered)}
    sim_ttft = (result.first_token_time - result.workload.arrival_time) * 1e3
    ref_sim, ref_forced = refused_ids(result, arrivals), refused_ids(forced, arrivals)
    pred_sim, pred_forced = predictions_ms(result, arrivals), predictions_ms(forced, arrivals)
    # live records (schedule order) <-> non-probe arrivals (arrival order)
    rp = run / "records_a.jsonl"
    if rp.exists():
        text = rp.read_text()
    else:
        with gzip.open(str(rp) + ".gz", "rt") as fh:
            text = fh.read()
    recs = [json.loads(line) for line in text.splitlines()]
    main_arr = [r for r in ordered if not (r.slo_ttft_ms or 0) > PROBE]
    joined = len(main_arr) == len(recs) and all(r.max_tokens == rec["max_tokens"]
                                                for r, rec in zip(main_arr, recs))
    live_ttft = {}
    if joined:
        for r, rec in zip(main_arr, recs):
            if rec["error"] is None and rec["ttft_s"] is not None:
                live_ttft[r.request_id] = rec["ttft_s"] * 1e3
    names = ("fast", "normal", "slow")

    def same_window_share(batches_b) -> float:
        """Requests with the same window on both sides (as a member set), or refused on both."""
        win_a = {rid: frozenset(b.request_ids) for b in live for rid in b.request_ids}
        win_b = {rid: frozenset(b.request_ids) for b in batches_b for rid in b.request_ids}
        same = sum(1 for r in arrivals if win_a.get(r.request_id) == win_b.get(r.request_id))
        return same / len(arrivals)
    adm = compare_admission(arrivals, ref_sim)
    adm_f = compare_admission(arrivals, ref_forced)
    w = compare(live, sim)
    wf = compare(live, forced_w)
    both = [i for i in live_ttft if i not in ref_sim]
    lt = np.array([live_ttft[i] for i in both])
    st = np.array([sim_ttft[idx[i]] for i in both])
    sim_own = sim_ttft[[idx[r.request_id] for r in main_arr if r.request_id not in ref_sim]]
    sim_own = sim_own[~np.isnan(sim_own)]
    out = {
        "run": str(run), "joined_records": joined, "num_arrivals": len(arrivals),
        "num_probes": len(ordered) - len(main_arr),
        "same_decision": adm["same_decision_share"], "refused_live_sim": adm["refused"],
        "same_decision_forced": adm_f["same_decision_share"],
        "mean_window": w["mean_window_size"], "same_windows": w["same_membership_share"],
        "same_windows_forced": wf["same_membership_share"],
        "requests_same_window": same_window_share(sim),
        "requests_same_window_forced": same_window_share(forced_w),
        "ttft_p50_ms_live_own": float(np.median(list(live_ttft.values()))) if live_ttft else None,
        "ttft_p50_ms_sim_own": float(np.median(sim_own)) if len(sim_own) else None,
        "ttft_p50_ms_both_live_sim": [float(np.median(lt)), float(np.nanmedian(st))] if len(lt) else None,
        "ttft_ratio_sim_over_live_both_p10_p50_p90": (
            [float(x) for x in np.nanquantile(st / lt, [0.1, 0.5, 0.9])] if len(lt) else None),
        "differing": [],
    }
    t0 = ordered[0].t
    for r in ordered:
        lr, sr = r.refused, r.request_id in ref_sim
        if lr != sr:
            ps = pred_sim.get(r.request_id, (None, None))
            pf = pred_forced.get(r.request_id, (None, None))
            out["differing"].append({
                "t": round(r.t - t0, 3), "class": names[r.queue_class], "probe": (r.slo_ttft_ms or 0) > PROBE,
                "live": "refused" if lr else "admitted", "live_pred_ms": r.predicted_ms,
                "live_margin_ms": r.margin_ms, "sim_pred_ms": ps[0], "sim_margin_ms": ps[1],
                "forced_same": (r.request_id in ref_forced) == lr, "forced_pred_ms": pf[0],
                "forced_margin_ms": pf[1], "live_ttft_ms": live_ttft.get(r.request_id),
                "sim_ttft_ms": None if sr else float(sim_ttft[idx[r.request_id]])})
    out["differing_forced"] = []
    for r in ordered:
        lr, fr = r.refused, r.request_id in ref_forced
        if lr != fr:
            pf = pred_forced.get(r.request_id, (None, None))
            out["differing_forced"].append({
                "t": round(r.t - t0, 3), "class": names[r.queue_class],
                "probe": (r.slo_ttft_ms or 0) > PROBE, "live": "refused" if lr else "admitted",
                "live_pred_ms": r.predicted_ms, "live_margin_ms": r.margin_ms,
                "sim_pred_ms": pf[0], "sim_margin_ms": pf[1], "forced_same": False,
                "live_ttft_ms": live_ttft.get(r.request_id)})
    s = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).write_text(s)
    d = dict(out)
    n_diff = len(d.pop("differing"))
    d.pop("differing_forced")
    print(json.dumps(d))
    print(f"differing decisions: {n_diff}; of them the forced replay agrees with live: "
          f"{sum(x['forced_same'] for x in out['differing'])}")


if __name__ == "__main__":
    main()
