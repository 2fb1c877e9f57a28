"""Issue 35, session 28: a profile's long "stream_mixed" run, read: its 1 s bins (pipelined / paused device time,
SM clock, board power), each shape's pipelined / paused (the prefix shapes last), the slow sag's fit
(`sims.profile_cost.fit_stream_sag`) and what the model makes of it.

    python bench/results/fidelity_sag_s28/stream_read.py PROFILE.json
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from sims.profile_cost import ProfileCost, fit_stream_sag


def main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    runs = (doc.get("pause_check") or {}).get("runs", [])
    run = next((r for r in runs if r.get("run") == "stream_mixed"), None)
    print(f"== {path}: {doc.get('model')} {doc.get('device_name', doc.get('device'))}")
    if run is None:
        print("no stream_mixed run")
        return
    for b in run.get("bins", []):
        print(f"  t {b['t_s']:5.1f} s  ratio {b['ratio']:.4f}  steps {b['steps']:4d}  SM {b['sm_clock_mhz']} MHz  "
              f"{b['power_w']} W")
    print(f"  settled (second half) {run['ratio']:.4f}")
    for shape, pa, pi in zip(run["shapes"], run["paused_device_ms"], run["pipelined_device_ms"], strict=True):
        print(f"  shape {shape!s:22s} paused {pa:8.3f} ms  pipelined {pi:8.3f} ms  ratio {pi / pa:.4f}")
    if run.get("bins"):
        print("  fit", fit_stream_sag(run["bins"], float(run.get("bin_s") or 1.0)))
        cost = ProfileCost.from_json(path, hide_launch=True, power_cap=True, cap_by_power=True)
        print("  model's sag", cost.cap_sag)


if __name__ == "__main__":
    main(sys.argv[1])
