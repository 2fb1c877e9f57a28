"""Totals over live runs (from this directory): `python live_sum.py old1 old2 ... -- new1 ...`:
admitted missing by > 10% per class, Slow admitted / met, probes within +-25% per class and
over all, Fast TTFT p90 range, same admission decisions (replay, forced) range."""
import json
import sys
from pathlib import Path


def total(runs: list[str]) -> str:
    miss = {"fast": 0, "normal": 0, "slow": 0}
    adm = {"fast": 0, "normal": 0, "slow": 0}
    probes = {"fast": [0, 0], "normal": [0, 0], "slow": [0, 0]}
    p90, same, forced, met_slow, sent_slow = [], [], [], 0, 0
    for run in runs:
        d = json.loads(Path(f"live_{run}/slo_control.json").read_text())
        f = json.loads(Path(f"live_{run}/decision_fidelity.json").read_text())
        c, a = d["compare"], d["admission"]
        for k, v in c["accepted_missing_by_10pct_counts"].items():
            miss[k] += v["missed"]
            adm[k] += v["admitted"]
        for k, v in c["probes"]["by_class"].items():
            probes[k][0] += round(v.get("within_25pct", 0) * v.get("n", 0))
            probes[k][1] += v.get("n", 0)
        p90.append(c["ttft_p90_ms_admitted"]["fast"])
        same.append(f["admission"]["same_decision_share"])
        forced.append(f["admission_forced"]["same_decision_share"])
        bs = a["by_class"]["slow"]
        met_slow += round(bs["slo_attainment"] * bs["num_requests"])
        sent_slow += bs["num_requests"]
    n_miss, n_adm = sum(miss.values()), sum(adm.values())
    pw = sum(v[0] for v in probes.values())
    pn = sum(v[1] for v in probes.values())
    return (f"runs {len(runs)}: admitted missing by > 10% {n_miss} / {n_adm} ({100 * n_miss / n_adm:.2f}%), "
            f"fast/normal/slow {miss['fast']}/{miss['normal']}/{miss['slow']} of {adm['fast']}/{adm['normal']}/{adm['slow']}; "
            f"probes within +-25% fast {probes['fast'][0]}/{probes['fast'][1]}, normal {probes['normal'][0]}/{probes['normal'][1]}, "
            f"slow {probes['slow'][0]}/{probes['slow'][1]}, all {pw}/{pn} ({100 * pw / max(1, pn):.1f}%); "
            f"Slow met {met_slow} / {sent_slow} ({100 * met_slow / sent_slow:.1f}% of sent); "
            f"Fast TTFT p90 {min(p90):.0f}-{max(p90):.0f} ms; same decisions {100 * min(same):.1f}-{100 * max(same):.1f}% "
            f"(forced {100 * min(forced):.1f}-{100 * max(forced):.1f}%)")


if __name__ == "__main__":
    args = sys.argv[1:]
    groups, cur = [], []
    for x in args:
        if x == "--":
            groups.append(cur)
            cur = []
        else:
            cur.append(x)
    groups.append(cur)
    for g in groups:
        print(total(g))
