"""Issue 31, fifteenth session: where a live Slow probe's wait goes (the t* runs of live.sh, the lag
trace on). For each probe (a refused request re-sent at once, admitted): the backend its Batch went
to, how many requests were waiting there when it arrived, and how many Fast / Normal requests were
sent to that backend after it and started before it (they overtake: the echo backend admits its
waiting requests Fast first); and the same counts on the other backends, to see whether the next
Fast and Normal requests went elsewhere.

    .venv/bin/python bench/results/slo_cpu_s15/probe_trace.py RUN_DIR ... [--json OUT]

Prints per run and pooled: the probes' wait against the overtakers' count (Spearman), the share of
the wait's variance over probes of similar Retry-After that the overtakers explain, and a table by
the Retry-After's size.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
from collections import Counter, defaultdict

import numpy as np

from scheduler.decisions import parse_records

PROBE_MS = 1e6


def _lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _records(run):
    p = os.path.join(run, "records_a.jsonl")
    return list(_lines(p if os.path.exists(p) else p + ".gz"))


def _decisions(run):
    p = os.path.join(run, "decisions_a.jsonl")
    p = p if os.path.exists(p) else p + ".gz"
    opener = gzip.open if p.endswith(".gz") else open
    with opener(p, "rt") as fh:
        arrivals, _ = parse_records(fh)
    return sorted(arrivals, key=lambda a: a.t)


def spearman(x, y) -> float:
    if len(x) < 3:
        return float("nan")
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def analyse(run: str) -> list[dict]:
    recs = _records(run)
    arrivals = _decisions(run)
    main = [a for a in arrivals if not (a.slo_ttft_ms or 0) > PROBE_MS]
    probes = [a for a in arrivals if (a.slo_ttft_ms or 0) > PROBE_MS]
    if len(main) != len(recs):
        raise SystemExit(f"{run}: {len(main)} arrivals, {len(recs)} records")
    # probes <-> the probed refusals: the earliest unmatched probed refusal before it, same length
    want = [(main[k], recs[k]) for k in range(len(recs))
            if recs[k]["error"] == "http_429" and recs[k]["probe_ttft_s"]]
    probe_of: dict[str, tuple] = {}
    used = set()
    for p in probes:
        for k, (a, r) in enumerate(want):
            if k not in used and a.t < p.t and a.max_tokens == p.max_tokens and a.queue_class == p.queue_class:
                used.add(k)
                probe_of[p.request_id] = (a, r)
                break
    t_lo, t_hi = arrivals[0].t - 1.0, arrivals[-1].t + 30.0
    sent_to: dict[str, int] = {}
    sent_at: dict[str, float] = {}
    cls_of = {a.request_id: a.queue_class for a in arrivals}
    for path in glob.glob(os.path.join(run, "trace", "gw_*.jsonl*")):
        for row in _lines(path):
            if row[0] == "send" and t_lo <= row[1] <= t_hi:
                for rid in row[3]:
                    if rid in cls_of:
                        sent_to[rid], sent_at[rid] = int(row[2]), row[1]
    started_at: dict[str, float] = {}
    waiting_at: dict[int, list] = defaultdict(list)  # backend -> [(t1, waiting)]
    for path in glob.glob(os.path.join(run, "trace", "be_*.jsonl*")):
        rows = [r for r in _lines(path) if r[0] in ("recv", "step") and t_lo <= r[1] <= t_hi]
        got = Counter(sent_to[r[2]] for r in rows if r[0] == "recv" and r[2] in sent_to)
        if not got:
            continue
        b = got.most_common(1)[0][0]
        for r in rows:
            if r[0] == "step":
                for rid in r[3]:
                    if rid in cls_of:
                        started_at[rid] = r[2]
                waiting_at[b].append((r[2], r[5]))
    out = []
    ids = sorted(sent_to, key=lambda i: sent_at[i])
    for pid, (a, r) in probe_of.items():
        if pid not in sent_to or pid not in started_at:
            continue
        b, ts, tst = sent_to[pid], sent_at[pid], started_at[pid]
        over = Counter()
        elsewhere = Counter()
        for rid in ids:
            t = sent_at[rid]
            if t <= ts or t >= tst or rid == pid:
                continue
            c = cls_of[rid]
            if sent_to[rid] == b and started_at.get(rid, np.inf) < tst:
                over[c] += 1
            elif sent_to[rid] != b:
                elsewhere[c] += 1
        wl = [w for t1, w in waiting_at[b] if t1 <= ts]
        out.append({"run": os.path.basename(run.rstrip("/")), "class": a.queue_class,
                    "retry_after_s": r["retry_after_s"], "wait_s": r["probe_ttft_s"],
                    "backend": b, "waiting_at_send": wl[-1] if wl else None,
                    "overtaken_fast": over[0], "overtaken_normal": over[1],
                    "overtaken_slow": over[2], "elsewhere_fast_normal": elsewhere[0] + elsewhere[1],
                    "send_to_start_s": tst - ts})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    for run in a.runs:
        got = analyse(run)
        slow = [r for r in got if r["class"] == 2]
        print(f"{os.path.basename(run.rstrip('/'))}: {len(got)} probes traced ({len(slow)} Slow)")
        rows += got
    slow = [r for r in rows if r["class"] == 2]
    w = np.array([r["wait_s"] for r in slow])
    ra = np.array([r["retry_after_s"] for r in slow])
    ov = np.array([r["overtaken_fast"] + r["overtaken_normal"] for r in slow])
    qa = np.array([r["waiting_at_send"] or 0 for r in slow])
    print(f"Slow probes {len(slow)}: Spearman(wait, Fast+Normal overtakers on its backend) "
          f"{spearman(w, ov):.2f}; (wait, Retry-After) {spearman(w, ra):.2f}; (wait, waiting at "
          f"its backend when sent) {spearman(w, qa):.2f}")
    print("| Retry-After | Slow probes | wait p50 s | RA p50 s | within +-25% | overtakers p10/p50/p90 "
          "| waiting when sent p50 | Fast+Normal sent elsewhere meanwhile p50 | Spearman(wait, overtakers) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lo, hi, name in ((0, 0.1, "< 0.1 s"), (0.1, 1, "0.1-1 s"), (1, 2.5, "1-2.5 s"),
                         (2.5, 1e9, ">= 2.5 s")):
        m = (ra >= lo) & (ra < hi)
        if not m.any():
            continue
        sel = [r for r, k in zip(slow, m) if k]
        hits = np.mean(np.abs(ra[m] / w[m] - 1) <= 0.25 + 1e-12)
        el = [r["elsewhere_fast_normal"] for r in sel]
        print(f"| {name} | {m.sum()} | {np.median(w[m]):.2f} | {np.median(ra[m]):.2f} | "
              f"{100 * hits:.0f}% | {np.percentile(ov[m], 10):.0f}/{np.median(ov[m]):.0f}/"
              f"{np.percentile(ov[m], 90):.0f} | {np.median(qa[m]):.0f} | {np.median(el):.0f} | "
              f"{spearman(w[m], ov[m]):.2f} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=0)
            fh.write("\n")


if __name__ == "__main__":
    main()
