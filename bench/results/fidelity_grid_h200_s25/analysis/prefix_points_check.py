"""Issue 35, session 25: would profile points at a long chunk start fix the under-charge that
chunk_start_bins.py finds (a chunk from a start >= 1,024 charged 0.92-0.93 of live)? A what-if on
this session's 6.7B profile: a copy gains, for each point whose chunk starts at 256, one starting at
1,280 (the long prompt's last chunk) whose times are 1.10 x what the model charged there before;
the model built from the copy is compared with the original at a few shapes. If the model followed
its points, the charge at start 1,280 would rise ~10 % and nothing far from it would move.
Run from the repo root:

    python bench/results/fidelity_grid_h200_s25/analysis/prefix_points_check.py
"""
import copy
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from sims.profile_cost import ProfileCost

SRC = HERE.parent / "6.7b-mixed-seeds" / "profile_6.7b-mixed-seeds.json"
TERMS = {"hide_launch": True, "power_cap": True, "cap_by_power": True}


def charge(cost: ProfileCost, d: int, p: int, s: int, c: int = 705) -> float:
    return 1e3 * cost.step_time(d, p, d * c + s + p, [(p, s)])


def main() -> None:
    doc = json.loads(SRC.read_text())
    base = ProfileCost.from_json(SRC, **TERMS)
    new, added = copy.deepcopy(doc), []
    for pt in doc["points"]:
        if pt.get("prefill_context_len") != 256:
            continue
        q = copy.deepcopy(pt)
        q["prefill_context_len"] = 1280
        q["num_context_tokens"] = pt["num_context_tokens"] + 1024
        f = 1.10 * charge(base, pt["num_decode_seqs"], pt["num_prefill_tokens"], 1280) / pt["step_ms_median"]
        for k in ("step_ms_median", "step_ms_min", "device_ms_median", "device_ms_min"):
            if isinstance(q.get(k), (int, float)):
                q[k] *= f
        if isinstance(q.get("step_ms"), list):
            q["step_ms"] = [x * f for x in q["step_ms"]]
        added.append(q)
    new["points"] += added
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile_whatif.json"
        path.write_text(json.dumps(new))
        cost = ProfileCost.from_json(path, **TERMS)
    print(f"{len(added)} points added at chunk start 1,280, each 1.10 x the model's charge there before")
    print(f"{'decodes':>7s} {'tokens':>6s} {'start':>6s} {'before ms':>10s} {'with them':>10s} {'ratio':>6s}")
    for d, p, s in [(0, 256, 1280), (8, 256, 1280), (128, 256, 1280), (16, 256, 1024), (16, 256, 1536),
                    (16, 256, 0), (16, 256, 256), (8, 256, 512)]:
        a, b = charge(base, d, p, s), charge(cost, d, p, s)
        print(f"{d:7d} {p:6d} {s:6d} {a:10.3f} {b:10.3f} {b / a:6.3f}")


if __name__ == "__main__":
    main()
