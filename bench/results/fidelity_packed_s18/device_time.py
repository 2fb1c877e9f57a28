"""Issue 35, session 18 (H35P): the "sustained_packed" run's added device time per profile, estimated
from the committed H200 profiles' own step times: the step `packed_check_shape` picks on each grid,
paused (1 warm-up + REPEATS, each after the profile's pause_ms), SUSTAIN_IDLE_S idle, SUSTAIN_S back
to back (the last step starts before the end: + half a step on average). At the paused point's time
(back to back it runs slower, by r_packed, which only stretches the last step's overrun).

    python device_time.py
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.engine.profile import SUSTAIN_IDLE_S, SUSTAIN_S, packed_check_shape

REPEATS = 10  # compare_pause's default
RES = Path(__file__).resolve().parents[1]
for prof in ["fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json", "fidelity_grid_h200_s16/6.7b-fp8/profile_6.7b-fp8.json",
             "fidelity_grid_h200_s16/6.7b/profile_6.7b.json", "fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json",
             "fidelity_grid_h200_s11/33b/profile_33b.json"]:
    doc = json.loads((RES / prof).read_text())
    pts = {(x["num_decode_seqs"], x["num_prefill_tokens"], x["context_len"], x.get("num_prefill_seqs", 1),
            x.get("prefill_context_len", 0)): x for x in doc["points"] if not x.get("num_draft_tokens")}
    shape = packed_check_shape(list(pts), int(doc["pause_check"]["num_prefill_tokens"]))
    t = pts[shape]["step_ms_median"] / 1e3
    pause = doc["pause_ms"] / 1e3
    paused = (REPEATS + 1) * (pause + t)
    total = paused + SUSTAIN_IDLE_S + SUSTAIN_S + t / 2
    print(f"{prof}: step (d, p, c, k, s) {shape} {1e3 * t:.1f} ms; paused {paused:.2f} s + idle {SUSTAIN_IDLE_S} "
          f"+ trace {SUSTAIN_S} + {t / 2:.2f} = {total:.1f} s ({int(SUSTAIN_S / t)} steps traced)")
