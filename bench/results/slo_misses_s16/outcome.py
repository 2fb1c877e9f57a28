"""Issue 31, s16 (H31M): the goal's parts per live run (scripts/gpu_slo_run.sh outputs), and pooled
per form (the runs' name prefix: d*, n*, q*, t*): Fast TTFT p90 of the admitted, the admitted
missing their class's TTFT target by > 10% (per class; in the first 2.2 s), the refused per class,
and the probed refusals' Retry-After within +-25% of the probe's TTFT, per class.

    python outcome.py RUN_DIR ... [--json OUT]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
from collections import defaultdict

import numpy as np

SLO = {"fast": 0.150, "normal": 0.400, "slow": 1.000}
CLASSES = ("fast", "normal", "slow")


def records(run):
    p = os.path.join(run, "records_a.jsonl")
    p = p if os.path.exists(p) else p + ".gz"
    with (gzip.open(p, "rt") if p.endswith(".gz") else open(p)) as fh:
        return [json.loads(x) for x in fh if x.strip()]


def one(run):
    recs = records(run)
    out = {"run": os.path.basename(run.rstrip("/"))}
    fast = [r["ttft_s"] for r in recs if r["class"] == "fast" and not r["error"] and r["ttft_s"] is not None]
    out["fast_p90_ms"] = float(np.percentile(fast, 90)) * 1e3
    for c in CLASSES:
        adm = [r for r in recs if r["class"] == c and not r["error"] and r["ttft_s"] is not None]
        miss = [r for r in adm if r["ttft_s"] > 1.1 * SLO[c]]
        ref = [r for r in recs if r["class"] == c and r["error"] == "http_429"]
        probes = [r for r in ref if r["probe_ttft_s"]]
        hits = sum(abs(r["retry_after_s"] / r["probe_ttft_s"] - 1) <= 0.25 + 1e-12 for r in probes)
        out[c] = {"sent": sum(r["class"] == c for r in recs), "admitted": len(adm),
                  "missed_10pct": len(miss), "missed_first_2.2s": sum(r["send_s"] < 2.2 for r in miss),
                  "missed_i": [r["i"] for r in miss], "refused": len(ref),
                  "probes": len(probes), "ra_hits": int(hits)}
    out["errors_other"] = sum(1 for r in recs if r["error"] and r["error"] != "http_429")
    lp = os.path.join(run, "load.txt")
    out["load"] = ""
    if os.path.exists(lp):
        with open(lp) as fh:
            out["load"] = fh.read().strip().replace("\n", " | ")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [one(r) for r in a.runs]
    for x in rows:
        print(f"{x['run']}: Fast p90 {x['fast_p90_ms']:.1f} ms; missed >10% F/N/S "
              + "/".join(str(x[c]["missed_10pct"]) for c in CLASSES)
              + " (first 2.2 s " + "/".join(str(x[c]["missed_first_2.2s"]) for c in CLASSES) + ")"
              + "; refused F/N/S " + "/".join(str(x[c]["refused"]) for c in CLASSES)
              + "; RA hits F/N/S " + " ".join(f"{x[c]['ra_hits']}/{x[c]['probes']}" for c in CLASSES)
              + f"; other errors {x['errors_other']}; {x['load']}")
    forms = defaultdict(list)
    for x in rows:
        forms[x["run"].replace("live_", "")[0]].append(x)
    print()
    for f, xs in sorted(forms.items()):
        n = len(xs)
        adm = sum(x[c]["admitted"] for x in xs for c in CLASSES)
        miss = {c: sum(x[c]["missed_10pct"] for x in xs) for c in CLASSES}
        ref = {c: sum(x[c]["refused"] for x in xs) for c in CLASSES}
        hit = {c: (sum(x[c]["ra_hits"] for x in xs), sum(x[c]["probes"] for x in xs)) for c in CLASSES}
        p90 = [x["fast_p90_ms"] for x in xs]
        print(f"form {f}*: {n} runs; admitted {adm}; missed >10% {sum(miss.values())} "
              f"({100 * sum(miss.values()) / adm:.2f}%) F/N/S {miss['fast']}/{miss['normal']}/{miss['slow']} "
              f"(per run {sum(miss.values()) / n:.2f}; Normal {miss['normal'] / n:.2f}); "
              f"refused per run F/N/S {ref['fast'] / n:.1f}/{ref['normal'] / n:.1f}/{ref['slow'] / n:.1f} "
              f"(all {sum(ref.values()) / n:.1f}); Fast p90 {min(p90):.1f}-{max(p90):.1f} ms (median "
              f"{np.median(p90):.1f}); RA within +-25%: "
              + ", ".join(f"{c} {100 * h / max(1, k):.1f}% ({h}/{k})" for c, (h, k) in hit.items()))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=0)


if __name__ == "__main__":
    main()
