"""What-if (issue 35, session 38): session 38's 6.7B runs (a slower H100) replayed on session 37's profile (a
faster one) with every point scaled by the card levels that a *third* card's profile reads against it.

Session 34's card is of the slower kind: at the profile check's shapes its 6.7B grid reads decode x1.035,
prefill x1.015 of session 37's (bench.simulator.profile_check.compare; no live data enters the scale). If the
cross-card error is the card's level alone, session 37's profile scaled so should replay session 38's runs as
an own profile would. Only the points' step and device times are scaled (the pause check's runs and the tile
pairs are left as measured), so this is a what-if, not a method: the profile check re-measures instead.

    python bench/results/pairs_s38/level_whatif.py [OUT_DIR]        # ~1 min on 2 cores
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
R = ROOT / "bench/results"
PART = R / "pairs_s38/h100_6.7b-seeds1-2/6.7b"
BASE = R / "pairs_s37/h100_6.7b/6.7b/profile_6.7b.json"   # the faster card's profile (the runs' own)
OTHER = R / "tiles_s34/h100_6.7b/6.7b/profile_6.7b.json"  # a slower card's profile: the levels


def levels() -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from bench.simulator import profile_check

    base, other = json.loads(BASE.read_text()), json.loads(OTHER.read_text())
    sub = profile_check.check_points(other, base)
    r = profile_check.compare(base, sub)
    return {k: v["median_ratio"] for k, v in r["kinds"].items()}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/level_whatif")
    lv = levels()
    print(f"levels of {OTHER.parent.parent.parent.name}'s card against {BASE.parent.parent.parent.name}'s: "
          + ", ".join(f"{k} x{v:.4f}" for k, v in lv.items()))
    d = out / "6.7b"
    d.mkdir(parents=True, exist_ok=True)
    for f in ("validate_6.7b.json", "decisions_6.7b.jsonl.gz", "steps_6.7b.jsonl.gz"):
        (d / f).unlink(missing_ok=True)
        (d / f).symlink_to(PART / f)
    doc = json.loads(BASE.read_text())
    for p in doc["points"]:
        f = lv["prefill"] if p["num_prefill_tokens"] else lv["decode"]
        for k, v in list(p.items()):
            if k.startswith(("step_ms", "device_ms")) and isinstance(v, (int, float)):
                p[k] = v * f
    (d / "profile_6.7b.json").write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [str(d / "validate_6.7b.json"), str(d / "decisions_6.7b.jsonl.gz"), str(d / "steps_6.7b.jsonl.gz")]
    for name, prof in (("as measured (the faster card's profile)", BASE), ("scaled to the slower card's levels",
                                                                          d / "profile_6.7b.json")):
        js = out / f"replay_{'scaled' if prof != BASE else 'base'}.json"
        subprocess.run([sys.executable, "-m", "bench.simulator.validate_replay", *args, "--profile", str(prof),
                        "--json", str(js)], check=True, env=env, cwd=ROOT, capture_output=True)
        print(f"\n{name}:\n")
        sys.stdout.flush()
        subprocess.run([sys.executable, "-m", "bench.simulator.fidelity_table", str(js)], check=True, env=env, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
