"""Issue 31, s16 (H31M): where an admitted request that missed its TTFT SLO by > 10% lost its
time, on the lag-traced live runs (slo_cpu_s15 live_t*: every Batch's backend, every step's
started requests). Per miss: the gateway's prediction at admission (pred_ms, margin_ms), the
backend, the requests ahead of it there when sent (same or higher class, not started), the
higher-class requests sent there AFTER it that started before it (overtakers: arrivals after the
admission decision), and the split of its TTFT: client->gateway, window, wire, backend queue,
step, first token back, gateway->client.

    python miss_trace.py RUN_DIR ... [--json OUT] [--all]   (--all: every admitted request)
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
from collections import Counter

from scheduler.decisions import parse_records

SLO = {0: 0.150, 1: 0.400, 2: 1.000}
PROBE_MS = 1e6


def _lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _file(run, name):
    p = os.path.join(run, name)
    return p if os.path.exists(p) else p + ".gz"


def load(run):
    recs = list(_lines(_file(run, "records_a.jsonl")))
    p = _file(run, "decisions_a.jsonl")
    with (gzip.open(p, "rt") if p.endswith(".gz") else open(p)) as fh:
        arrivals, _ = parse_records(fh)
    arrivals = sorted(arrivals, key=lambda a: a.t)
    main = [a for a in arrivals if not (a.slo_ttft_ms or 0) > PROBE_MS]
    if len(main) != len(recs):
        raise SystemExit(f"{run}: {len(main)} arrivals, {len(recs)} records")
    return recs, arrivals, main


def analyse(run, every=False):
    recs, arrivals, main = load(run)
    cls_of = {a.request_id: a.queue_class for a in arrivals}
    tr = os.path.join(run, "trace")
    sent_to, sent_at, first_at = {}, {}, {}
    for path in glob.glob(os.path.join(tr, "gw_*.jsonl*")):
        for row in _lines(path):
            if row[0] == "send":
                for rid in row[3]:
                    if rid in cls_of:
                        sent_to[rid], sent_at[rid] = int(row[2]), row[1]
            elif row[0] == "first" and row[1] in cls_of:
                first_at[row[1]] = row[2]
    start_step, recv_at, steps_of = {}, {}, {}
    for path in glob.glob(os.path.join(tr, "be_*.jsonl*")):
        rows = list(_lines(path))
        got = Counter(sent_to[r[2]] for r in rows if r[0] == "recv" and r[2] in sent_to)
        if not got:
            continue
        b = got.most_common(1)[0][0]
        steps_of[b] = [r for r in rows if r[0] == "step"]
        for r in rows:
            if r[0] == "recv" and r[2] in cls_of:
                recv_at[r[2]] = r[1]
            elif r[0] == "step":
                for rid in r[3]:
                    if rid in cls_of:
                        start_step[rid] = (r[1], r[2], r[4], r[5])
    # client clock offset: client send = t0 + send_s; the gateway's `received` is later by the
    # HTTP path; t0 estimated as min(received - send_s)
    t0 = min(a.received - r["send_s"] for a, r in zip(main, recs) if a.received is not None)
    out = []
    for a, r in zip(main, recs):
        if a.refused or r["error"] or r["ttft_s"] is None:
            continue
        slo = SLO[a.queue_class]
        ratio = r["ttft_s"] / slo
        if not every and ratio <= 1.1:
            continue
        rid = a.request_id
        row = {"run": os.path.basename(run.rstrip("/")), "i": r["i"], "class": a.queue_class,
               "t_run": a.t - main[0].t, "ttft": r["ttft_s"], "ratio": ratio,
               "pred": (a.predicted_ms or 0) / 1e3, "margin": (a.margin_ms or 0) / 1e3,
               "max_tokens": a.max_tokens}
        if rid in sent_to and rid in start_step:
            b = sent_to[rid]
            s0, s1, _, _ = start_step[rid]
            ts = sent_at[rid]
            ahead = Counter()
            over = Counter()
            for o, ob in sent_to.items():
                if ob != b or o == rid:
                    continue
                st = start_step.get(o)
                if sent_at[o] < ts and (st is None or st[1] > ts):
                    ahead[cls_of[o]] += 1
                if sent_at[o] > ts and st is not None and st[0] < s0:
                    over[cls_of[o]] += 1
            # the running count when it was sent: the last step that ended before ts
            prev = [s for s in steps_of.get(b, []) if s[2] <= ts]
            row.update({
                "backend": b, "ahead": dict(ahead), "overtakers": dict(over),
                "running_at_send": prev[-1][4] if prev else None,
                "waiting_at_send": prev[-1][5] if prev else None,
                "c_to_gw": a.received - (t0 + r["send_s"]),
                "gw_front": a.t - a.received,
                "window": ts - a.t,
                "wire": recv_at.get(rid, ts) - ts,
                "be_queue": s0 - recv_at.get(rid, ts),
                "step": s1 - s0,
                "back": first_at.get(rid, s1) - s1,
                "gw_to_client": (t0 + r["send_s"] + r["ttft_s"]) - first_at.get(rid, s1),
                "gw_ttft": first_at.get(rid, s1) - a.t,
            })
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    rows = []
    for run in a.runs:
        rows += analyse(run, a.all)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=0)
    if a.all:
        return
    for x in rows:
        print(f"{x['run']} i={x['i']:3d} c={x['class']} t={x['t_run']:6.2f} ttft={x['ttft']*1e3:6.0f} "
              f"r={x['ratio']:.2f} pred={x['pred']*1e3:5.0f} m={x['margin']*1e3:4.0f} "
              f"b={x.get('backend')} ahead={x.get('ahead')} over={x.get('overtakers')} "
              f"run/wait@send={x.get('running_at_send')}/{x.get('waiting_at_send')} "
              + " ".join(f"{k}={x[k]*1e3:.0f}" for k in ("c_to_gw", "gw_front", "window", "wire",
                                                        "be_queue", "step", "back", "gw_to_client")
                         if k in x))


if __name__ == "__main__":
    main()
