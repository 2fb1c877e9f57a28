"""Issue 35, session 28: the cap's anchors in device time, a what-if on the H100 6.7B mixed part (s21). The
stream_kind runs measured this session on an H100 (`h100_pause_check_kinds.json`: the same model, the s21 part's
pause-check shapes) are grafted onto the s21 profile, and the part's live steps are charged with the cap's ratios
from the sustained runs' wall times (the default) and from those runs (`cap_anchors="stream"`): model / live by
step kind (`bench.simulator.fidelity_steps.step_cost_table`). Then the part's cells, both forms
(`validate_replay --cap-anchors`). Run from the root (CPU, ~1 min):

    python bench/results/fidelity_sag_s28/anchors_whatif.py > bench/results/fidelity_sag_s28/anchors_whatif.txt
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_steps import (
    format_cost_table,
    live_steps,
    read_steps,
    step_cost_table,
)
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

HERE = Path(__file__).resolve().parent
D = ROOT / "bench/results/fidelity_grid_h100_s21/6.7b-mixed-seeds"
P = "6.7b-mixed-seeds"


def main() -> None:
    doc = json.loads((D / f"profile_{P}.json").read_text())
    kinds = [r for r in json.loads((HERE / "h100_pause_check_kinds.json").read_text())["pause_check"]["runs"]
             if r["run"] == "stream_kind"]
    doc["pause_check"]["runs"] += kinds
    print("grafted:", {r["kind"]: round(r["ratio"], 4) for r in kinds})
    # row 1d's kinds (13:58, another H100 call) between the anchors, at their middle shapes: 8-32 decodes at 705
    # beside 256 tokens from 0 (settled 1.0128), and beside two 128-token chunks from 256 (1.017)
    row1d = json.loads((HERE / "h100_kinds.json").read_text())["kinds"]
    extra = [{"run": "stream_kind", "kind": "mixed_short", "ratio": row1d["start0"]["bins"][-1]["ratio"],
              "shape": [16, 256, 705, 1, 0]},
             {"run": "stream_kind", "kind": "mixed_two_chunks", "ratio": row1d["two_chunks"]["bins"][-1]["ratio"],
              "shape": [16, 256, 705, 2, 256]}]
    with tempfile.TemporaryDirectory() as tmp:
        prof = Path(tmp) / f"profile_{P}.json"
        prof.write_text(json.dumps(doc))
        doc_x = json.loads(json.dumps(doc))
        # the call-3 two-chunk kind (no shape: not an anchor) replaced by row 1d's
        doc_x["pause_check"]["runs"] = [r for r in doc_x["pause_check"]["runs"]
                                        if r.get("kind") != "mixed_two_chunks"] + extra
        prof_x = Path(tmp) / "x" / f"profile_{P}.json"
        prof_x.parent.mkdir()
        prof_x.write_text(json.dumps(doc_x))
        print("and, as anchors of their own:", {r["kind"]: (r["shape"], r["ratio"]) for r in extra})
        arrivals, _ = read_log(str(D / f"decisions_{P}.jsonl.gz"))
        steps, _ = live_steps(read_steps(D / f"steps_{P}.jsonl.gz"), {x.request_id: x.max_tokens for x in arrivals})
        for form, path in (("sustained", prof), ("stream", prof), ("stream, row 1d's kinds as anchors", prof_x)):
            anchors = "sustained" if form == "sustained" else "stream"
            cost = ProfileCost.from_json(path, hide_launch=True, power_cap=True, cap_by_power=True,
                                         cap_anchors=anchors)
            cap = cost.describe()["power_cap"]
            print(f"\n== anchors {form}: r {cost.sustained_fit['r']:.4f} (reference "
                  f"{(cap.get('by_power_packed') or {}).get('reference', 'check')}), r_mix {cap['by_power']['r_mix']:.4f}, "
                  f"w_mix {cap['by_power']['w_mix']:.3f}"
                  + "".join(f", {a['kind']} r {a['r']:.4f} w {a['w']:.3f} at rate {a['rate']:.3f}"
                            for a in cap["by_power"].get("extra_anchors", [])))
            rows = [r for r in step_cost_table(cost, steps) if not r["bin"].startswith("  ")]
            print(format_cost_table(rows))
            out = subprocess.run([sys.executable, "-m", "bench.simulator.validate_replay", str(D / f"validate_{P}.json"),
                                  str(D / f"decisions_{P}.jsonl.gz"), str(D / f"steps_{P}.jsonl.gz"), "--profile",
                                  str(path), "--ceiling", "0", "--cap-anchors", anchors],
                                 cwd=ROOT, capture_output=True, text=True, check=True).stdout
            print("\n".join(line.split("; same chunks")[0] for line in out.splitlines() if "x: ttft_p50" in line))


if __name__ == "__main__":
    main()
