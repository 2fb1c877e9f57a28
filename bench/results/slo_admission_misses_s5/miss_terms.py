"""What the admitted misses look like (issue 31, fifth session): seeds 0-4 of the benchmark's
simulated twin; per admitted request, its prediction's terms at its check on the backend chosen
(slot wait with / without the projected arrivals, first slot free, the higher classes' rate, the
margin) and what happened (TTFT, higher-class requests that arrived after it and started before
it on its backend). Usage (repository root):

    .venv/bin/python bench/results/slo_admission_misses_s5/miss_terms.py [FIELD=V,...] [rows.pkl]
"""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import argparse

from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.retry_after_bound import _loop, parse_admission
from sims.workload import generate

ARGS = ["--step-ms", "20", "--placement", "ttft", "--max-num-seqs", "8", "--waiting-by-class", "--slot-model", "--backends", "4", "--rate", "47.8", "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80", "--slo-ttft-ms", "fast=150,normal=400,slow=1000"]


def run(seed, admission=None):
    p = argparse.ArgumentParser()
    add_run_args(p, num_requests=600)
    a = parse_with_config(p, ARGS + ["--seed", str(seed)])
    spec = spec_from_args(a)
    spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
    w = generate(spec.workload)
    loop = _loop(spec, w, admission)
    adm = loop.gateway.admission
    pred = adm.predictor
    check = adm.check
    rec = {}
    ctr = [0]

    def rcheck(cls, depths, window_s, ttft_override_ms=None, live=None, now=None):
        i = ctr[0]
        ctr[0] += 1
        r = check(cls, depths, window_s, ttft_override_ms, live, now)
        if adm.last_predicted_s is None:
            return r
        # the best backend again, and the slot wait's terms there
        _, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
        be = pred.backends.get(b)
        d = {"cls": cls, "now": now, "pred": adm.last_predicted_s, "margin": adm.last_margin_s,
             "refused": r is not None, "b": b, "window": window_s,
             "gw_ahead": sum(depths[: cls + 1])}
        if be is not None and be.step:
            saved = pred.config
            full = pred._slot_wait(be, cls, 0, now)
            pred.config = replace(saved, arrival_horizon_s=0.0)
            noarr = pred._slot_wait(be, cls, 0, now)
            pred.config = saved
            rate_h, mt_h = pred.higher_rate(be, cls, now)
            fin = sorted(pred._live_finishes(be, now))
            d.update(slot_full=full, slot_noarr=noarr, rate_h=rate_h, mt_h=mt_h,
                     first_free=(fin[0] - now) if fin and len(fin) >= be.slots else 0.0,
                     slots=be.slots, running=len(fin), queued=len(be.queued),
                     queued_high=sum(1 for q in be.queued.values() if q[0] < cls),
                     queued_same=sum(1 for q in be.queued.values() if q[0] == cls),
                     step=be.step)
        rec[i] = d
        return r

    adm.check = rcheck
    disp = {}
    dispatched = pred.dispatched

    def rdisp(b, cls, key=None, max_tokens=0):
        if key is not None:
            disp[key] = b
        return dispatched(b, cls, key, max_tokens)

    pred.dispatched = rdisp
    res = loop.run()
    return spec, w, res, rec, disp


def analyse(seed, admission=None, verbose=False):
    spec, w, res, rec, disp = run(seed, admission)
    arr = w.arrival_time
    ft = res.first_token_time
    dt = res.dispatch_time
    qc = [int(c) for c in res.queue_class]
    rows = []
    for i, d in rec.items():
        if d["refused"]:
            continue
        dl = spec.scheduler.slo.ttft_s(d["cls"], None)
        ttft = ft[i] - arr[i]
        b = disp.get(i)
        # higher-class requests arriving after i, sent to its backend, started before it
        passed = [j for j in range(i + 1, len(w)) if qc[j] < d["cls"] and disp.get(j) == b
                  and ft[j] < ft[i]]
        # the same, of its class or higher sent earlier (queued ahead at arrival)
        row = dict(d, i=i, ttft=ttft, deadline=dl, miss=ttft > 1.1 * dl, backend=b,
                   same_b=(b == d["b"]), win_actual=dt[i] - arr[i], passed=len(passed),
                   passed_tokens=sum(int(w.output_len[j]) for j in passed))
        if "rate_h" in d:
            row["proj_arr"] = d["rate_h"] * min(d["slot_full"] or 0.0, spec.scheduler.admission and 5.0)
        rows.append(row)
    return rows


if __name__ == "__main__":
    adm = parse_admission(sys.argv[1]) if len(sys.argv) > 1 else None
    allrows = []
    for s in range(5):
        allrows += [dict(r, seed=s) for r in analyse(s, adm)]
    miss = [r for r in allrows if r["miss"]]
    print("admitted", len(allrows), "missed", len(miss))
    from collections import Counter
    print(Counter(r["cls"] for r in miss))
    for r in miss:
        if r["cls"] != 2:
            print("nonslow", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    print(f"{'seed':>4} {'i':>4} {'cls':>3} {'pred':>6} {'marg':>6} {'ttft':>6} {'win':>5} {'slotF':>6} "
          f"{'slotN':>6} {'ffree':>6} {'rate':>5} {'proj':>5} {'pass':>4} {'qH':>3} {'qS':>3} same")
    for r in miss:
        r = {k: (-1 if v is None else v) for k, v in r.items()}
        if r["cls"] == 2:
            print(f"{r['seed']:>4} {r['i']:>4} {r['cls']:>3} {r['pred']:6.3f} {r['margin']:6.3f} {r['ttft']:6.3f} "
                  f"{r['win_actual']:5.3f} {r.get('slot_full', -1):6.3f} {r.get('slot_noarr', -1):6.3f} "
                  f"{r.get('first_free', -1):6.3f} {r.get('rate_h', -1):5.1f} {r.get('proj_arr', -1):5.1f} "
                  f"{r['passed']:>4} {r.get('queued_high', -1):>3} {r.get('queued_same', -1):>3} {r['same_b']}")
    import pickle
    with open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/miss_rows.pkl", "wb") as fh:
        pickle.dump(allrows, fh)
