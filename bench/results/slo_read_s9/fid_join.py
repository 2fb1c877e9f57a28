"""Issue 31, ninth session: the eighth session's fid_join.py, plus --distinct-prompts,
--gateway-read-delay-ms and, for runs traced with slo_lag_s8/trace (their "send" records: each
Batch's backend), the forced replay with the live placement followed too ("forced_placed") and
how many requests the forced replay placed where the live gateway did ("placed_same").

Issue 31, eighth session (from the seventh's fid_join.py, plus the replay's engine knobs below:
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


def live_placement(run: Path) -> dict[str, int] | None:
    """Request id -> the backend its Batch went to, from a lag trace's gateway "send" records
    (the gateway numbers its backends in the order given, as the simulator does); None: untraced."""
    files = sorted((run / "trace").glob("gw_*.jsonl*"))
    if not files:
        return None
    out = {}
    for f in files:
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt") as fh:
            for line in fh:
                r = json.loads(line)
                if r[0] == "send":
                    for rid in r[3]:
                        out[rid] = int(r[2])
    return out


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
    ap.add_argument("--distinct-prompts", action="store_true",
                    help="each request's prompt its own (hashed for placement, as the live gateway "
                         "hashes the bench's random prompts: a cold prefix goes to the next backend "
                         "in turn; SimSchedulerConfig.enable_prefix_caching)")
    ap.add_argument("--gateway-read-delay-ms", type=float, default=0.0,
                    help="backend -> gateway delay of a step's outputs "
                         "(EngineConfig.gateway_read_delay_s)")
    ap.add_argument("--compete-window", action="store_true",
                    help="the live gateway's --compete-window (AdmissionConfig.compete_window)")
    ap.add_argument("--placement-tie-break", default="load", choices=("load", "hash"),
                    help="the live gateway's --placement-tie-break (slo_tie_s10)")
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
                               max_num_seqs=8,
                               enable_prefix_caching=True if a.distinct_prompts else None,
                               compete_window=a.compete_window)
    cost = ConstantCost(a.step_ms / 1e3, num_blocks=1 << 14)
    eng = EngineConfig(num_samples=1, num_backends=4, placement=PlacementConfig(policy="ttft", ttft_tie_break=a.placement_tie_break),
                       network_delay_s=a.network_delay_ms / 1e3,
                       gateway_message_s=a.gateway_message_us / 1e6,
                       backend_message_s=a.backend_message_us / 1e6,
                       delivery_delay_s=a.delivery_delay_ms / 1e3,
                       gateway_read_delay_s=a.gateway_read_delay_ms / 1e3)
    result, sim = replay_run(arrivals, sched, cost, eng)
    forced, forced_w = replay_run(arrivals, sched, cost, eng, forced=True)
    live_b = live_placement(run)
    forced_p = replay_run(arrivals, sched, cost, eng, forced=True, backends=live_b)[0] if live_b else None
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
    names_of = ("fast", "normal", "slow")
    # schedule order vs the gateway's arrival order: requests sent a few ms apart may reach the
    # batcher swapped; each record takes the first unmatched arrival within the next 8 of the
    # same max_tokens and class (the eighth session's join required the orders to be equal)
    pairs, used, lo = [], set(), 0
    for rec in recs:
        while lo in used:
            lo += 1
        for j in range(lo, min(len(main_arr), lo + 8)):
            r = main_arr[j]
            if j not in used and r.max_tokens == rec["max_tokens"] and \
                    names_of[r.queue_class] == rec["class"]:
                used.add(j)
                pairs.append((r, rec))
                break
    joined = len(main_arr) == len(recs) == len(pairs)
    live_ttft = {}
    if joined:
        for r, rec in pairs:
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
    if forced_p is not None:
        ref_fp = refused_ids(forced_p, arrivals)
        pred_fp = predictions_ms(forced_p, arrivals)
        bo = forced.extra["backend_of"]
        placed = [(live_b[r.request_id], bo[idx[r.request_id]]) for r in ordered if r.request_id in live_b]
    w = compare(live, sim)
    wf = compare(live, forced_w)
    both = [i for i in live_ttft if i not in ref_sim]
    lt = np.array([live_ttft[i] for i in both])
    st = np.array([sim_ttft[idx[i]] for i in both])
    ttft_fp = None
    if forced_p is not None and live_ttft:
        fp_ttft = (forced_p.first_token_time - forced_p.workload.arrival_time) * 1e3
        ids = [i for i in live_ttft if not np.isnan(fp_ttft[idx[i]])]
        ttft_fp = [float(np.median([live_ttft[i] for i in ids])),
                   float(np.median([fp_ttft[idx[i]] for i in ids]))]
    sim_own = sim_ttft[[idx[r.request_id] for r in main_arr if r.request_id not in ref_sim]]
    sim_own = sim_own[~np.isnan(sim_own)]
    out = {
        "run": str(run), "joined_records": joined, "num_arrivals": len(arrivals),
        "num_probes": len(ordered) - len(main_arr),
        "same_decision": adm["same_decision_share"], "refused_live_sim": adm["refused"],
        "same_decision_forced": adm_f["same_decision_share"],
        "same_decision_forced_placed": (compare_admission(arrivals, ref_fp)["same_decision_share"]
                                        if forced_p is not None else None),
        "placed_same": (sum(x == y for x, y in placed) / len(placed)) if forced_p is not None else None,
        "mean_window": w["mean_window_size"], "same_windows": w["same_membership_share"],
        "same_windows_forced": wf["same_membership_share"],
        "requests_same_window": same_window_share(sim),
        "requests_same_window_forced": same_window_share(forced_w),
        "ttft_p50_ms_live_own": float(np.median(list(live_ttft.values()))) if live_ttft else None,
        "ttft_p50_ms_sim_own": float(np.median(sim_own)) if len(sim_own) else None,
        "ttft_p50_ms_both_live_sim": [float(np.median(lt)), float(np.nanmedian(st))] if len(lt) else None,
        # the replay with the live decisions and placement: the timing model alone
        "ttft_p50_ms_forced_placed_live_sim": ttft_fp,
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
    out["differing_forced_placed"] = []
    if forced_p is not None:
        for r in ordered:
            lr, fr = r.refused, r.request_id in ref_fp
            if lr != fr:
                pf = pred_fp.get(r.request_id, (None, None))
                out["differing_forced_placed"].append({
                    "t": round(r.t - t0, 3), "class": names[r.queue_class],
                    "probe": (r.slo_ttft_ms or 0) > PROBE, "live": "refused" if lr else "admitted",
                    "live_pred_ms": r.predicted_ms, "live_margin_ms": r.margin_ms,
                    "sim_pred_ms": pf[0], "sim_margin_ms": pf[1]})
    s = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).write_text(s)
    d = dict(out)
    n_diff = len(d.pop("differing"))
    d.pop("differing_forced")
    d.pop("differing_forced_placed")
    print(json.dumps(d))
    print(f"differing decisions: {n_diff}; of them the forced replay agrees with live: "
          f"{sum(x['forced_same'] for x in out['differing'])}")


if __name__ == "__main__":
    main()
