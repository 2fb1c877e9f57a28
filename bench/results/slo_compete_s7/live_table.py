"""The live table of BENCHMARKS (issue 31, sixth session): `python live_table.py old1 new1 ...`
from this directory. Columns: load average at start-end; admitted missing by > 10% (count /
admitted); by class (fast / normal / slow); of them sent in the first 2.2 s (by class); Slow
admitted (of them in the first 2.2 s); Fast TTFT p90 of the admitted; refused by class; met
by class (refused count as missed); Slow probes within +-25% (Retry-After / probed wait p50);
same admission decisions, replay vs live (forced)."""
import json
import sys
from pathlib import Path


def row(run: str) -> str:
    d = json.loads(Path(f"live_{run}/slo_control.json").read_text())
    f = json.loads(Path(f"live_{run}/decision_fidelity.json").read_text())
    load = [line.split()[-1] for line in Path(f"live_{run}/load.txt").read_text().splitlines()]
    c, a = d["compare"], d["admission"]
    bc, mc = a["by_class"], c.get("accepted_missing_by_10pct_counts")
    sp = c["probes"]["by_class"].get("slow", {})
    frac = c["accepted_missing_deadline_by_10pct"]
    s = f"| {run} | {'-'.join(load)} | {100 * frac:.1f}% ({round(frac * a['completed'])} / {a['completed']}) | "
    if mc:
        by = " / ".join(str(mc.get(k, {}).get("missed", 0)) for k in ("fast", "normal", "slow"))
        w = sum(v["missed_warmup"] for v in mc.values())
        wa = sum(v["admitted_warmup"] for v in mc.values())
        wby = " / ".join(str(mc.get(k, {}).get("missed_warmup", 0)) for k in ("fast", "normal", "slow"))
        s += f"{by} | {w} of {wa} ({wby}) | {mc['slow']['admitted']} ({mc['slow']['admitted_warmup']}) | "
    else:
        s += "- | - | - | "
    return s + (
        f"{c['ttft_p90_ms_admitted']['fast']:.0f} | "
        f"{bc['fast']['num_refused']} / {bc['normal']['num_refused']} / {bc['slow']['num_refused']} | "
        f"{100 * bc['fast']['slo_attainment']:.0f} / {100 * bc['normal']['slo_attainment']:.1f} / "
        f"{100 * bc['slow']['slo_attainment']:.1f} | "
        f"{round(sp.get('within_25pct', 0) * sp.get('n', 0))} / {sp.get('n', 0)} ({sp.get('p50', 0):.2f}) | "
        f"{100 * f['admission']['same_decision_share']:.1f}% "
        f"({100 * f['admission_forced']['same_decision_share']:.1f}%) |")


if __name__ == "__main__":
    for run in sys.argv[1:]:
        print(row(run))
